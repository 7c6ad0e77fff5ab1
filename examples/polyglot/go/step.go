// Step 2 of the polyglot chain, in Go: checks that the Python step came first and appends
// its tag, both on the slot's bytes (r.Body is a slice over shared memory). A body starting
// with `SLEEP-GO:` first says "go: holding the request" on standard error and holds it for a
// minute (the tests wait for that line, then kill the instance while it holds the request).
package main

import (
	"bytes"
	"fmt"
	"os"
	"time"

	"zerohop.dev/zerohop"
)

func main() {
	zerohop.Run(func(r *zerohop.Request) (zerohop.Next, error) {
		b := r.Body()
		if !bytes.HasSuffix(b, []byte("+py")) {
			return zerohop.Continue, &zerohop.Error{Status: 500, Message: "go: the Python step did not run first"}
		}
		if bytes.HasPrefix(b, []byte("SLEEP-GO:")) {
			fmt.Fprintln(os.Stderr, "go: holding the request")
			time.Sleep(time.Minute)
		}
		return zerohop.Continue, r.Extend([]byte("+go"))
	})
}
