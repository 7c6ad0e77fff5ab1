// {{name}}: a zerohop function in Go. It upper-cases the request body in place, in the
// chain's shared memory, and passes it on.
package main

import "zerohop.dev/zerohop"

func main() {
	zerohop.Run(func(r *zerohop.Request) (zerohop.Next, error) {
		b := r.Body()
		for i, c := range b {
			if 'a' <= c && c <= 'z' {
				b[i] = c - ('a' - 'A')
			}
		}
		return zerohop.Continue, nil
	})
}
