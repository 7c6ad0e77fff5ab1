// Command fusedfn serves upper and exclaim from one Go program with RunNamed: the test of a
// fused group (`fuse: [[upper, exclaim]]`) runs both steps in one instance.
package main

import (
	"bytes"
	"os"
	"strconv"

	zerohop "zerohop.dev/zerohop"
)

func main() {
	zerohop.RunNamed(map[string]zerohop.Handler{
		"upper": func(r *zerohop.Request) (zerohop.Next, error) {
			body := r.Body()
			copy(body, bytes.ToUpper(body))
			return zerohop.Continue, nil
		},
		"exclaim": func(r *zerohop.Request) (zerohop.Next, error) {
			if string(r.Body()) == "NO" {
				return zerohop.Continue, &zerohop.Error{Status: 422, Message: "refusing " + r.Function()}
			}
			if string(r.Body()) == "PID" {
				return zerohop.Continue, r.SetBody([]byte(strconv.Itoa(os.Getpid())))
			}
			return zerohop.Continue, r.Extend([]byte("!"))
		},
	})
}
