// The Go row of zerohop-bench-languages, the same pass-through as ../pass.rs: reads the
// body's first byte in place (no copy) and sends the body on unchanged.
package main

import "zerohop.dev/zerohop"

// first keeps the read from being optimised out.
var first byte

func main() {
	zerohop.Run(func(r *zerohop.Request) (zerohop.Next, error) {
		if b := r.Body(); len(b) > 0 {
			first = b[0]
		}
		return zerohop.Continue, nil
	})
}
