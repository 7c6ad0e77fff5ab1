// upper: a zerohop function in Go that upper-cases the request body in place.
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
