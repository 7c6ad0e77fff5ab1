// testfn: a Go function for the SDK's tests, its behaviour chosen by GOFN_MODE:
// upper (in place), exclaim (appends "!"), fail (422 "refusing BODY"), panic, call
// (calls GOFN_CALLS, comma separated, at once: "name=output;" or "name!status;"), count
// (adds one to the state counter named by the body), header (the X-Test header),
// forward (to GOFN_TARGET), item (for GET /item/{id} with `headers: [":path", ":query",
// cookie]`: answers 303 with a Location and a Set-Cookie naming the id, and a body of what
// it read: path, route, param, query string, decoded query q, cookie session, and what a
// refused header and status said), sleep (says "gofn: holding BODY" on stderr, which zerohop up
// echoes, so the test knows the request reached the handler; then 2 s, or 60 s for a body
// starting with "hold": a request the test kills, which only the kill ends in time; then
// upper-cases).
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"zerohop.dev/zerohop"
)

func upper(b []byte) {
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - ('a' - 'A')
		}
	}
}

// orDash is v, or "-" when it is absent.
func orDash(v string, ok bool) string {
	if !ok {
		return "-"
	}
	return v
}

func item(r *zerohop.Request) (zerohop.Next, error) {
	id, ok := r.Param("id")
	if !ok {
		return zerohop.Continue, &zerohop.Error{Status: 500, Message: "no parameter id"}
	}
	refused := r.AddResponseHeader("Content-Length", "1")
	status404 := r.SetStatus(404)
	body := fmt.Sprintf("path=%s route=%s id=%s query=%s q=%s session=%s refused=%v status404=%v",
		r.Path(), r.RoutePath(), id, orDash(r.QueryString()), orDash(r.Query("q")),
		orDash(r.Cookie("session")), refused, status404)
	if err := r.SetBody([]byte(body)); err != nil {
		return zerohop.Continue, err
	}
	// After the body: the headers move it up within the slot.
	if err := r.AddResponseHeader("Location", "/item/"+id+"/done"); err != nil {
		return zerohop.Continue, err
	}
	if err := r.AddResponseHeader("Set-Cookie", "seen="+id+"; Path=/"); err != nil {
		return zerohop.Continue, err
	}
	return zerohop.Continue, r.SetStatus(303)
}

func main() {
	mode := os.Getenv("GOFN_MODE")
	zerohop.Run(func(r *zerohop.Request) (zerohop.Next, error) {
		switch mode {
		case "upper":
			upper(r.Body())
			return zerohop.Continue, nil
		case "exclaim":
			return zerohop.Continue, r.Extend([]byte("!"))
		case "fail":
			return zerohop.Continue, &zerohop.Error{Status: 422, Message: "refusing " + string(r.Body())}
		case "panic":
			panic("boom")
		case "call":
			var calls []zerohop.Call
			names := strings.Split(os.Getenv("GOFN_CALLS"), ",")
			for _, n := range names {
				calls = append(calls, zerohop.Call{Function: n, Input: r.Body()})
			}
			var out strings.Builder
			for i, a := range r.CallAll(calls) {
				if a.Status() == 200 {
					fmt.Fprintf(&out, "%s=%s;", names[i], a.Body())
				} else {
					fmt.Fprintf(&out, "%s!%d;", names[i], a.Status())
				}
				a.Close()
			}
			return zerohop.Continue, r.SetBody([]byte(out.String()))
		case "count":
			key := append([]byte(nil), r.Body()...)
			old, found, err := r.StateGet(key)
			if err != nil {
				return zerohop.Continue, err
			}
			var n uint64
			if found && len(old) == 8 {
				n = binary.LittleEndian.Uint64(old)
			}
			n++
			if err := r.StatePut(key, binary.LittleEndian.AppendUint64(nil, n)); err != nil {
				return zerohop.Continue, err
			}
			return zerohop.Continue, r.SetBody([]byte(strconv.FormatUint(n, 10)))
		case "header":
			v, ok := r.Header("X-Test")
			if !ok {
				v = "<none>"
			}
			return zerohop.Continue, r.SetBody([]byte(v))
		case "forward":
			return zerohop.Forward(os.Getenv("GOFN_TARGET")), nil
		case "item":
			return item(r)
		case "sleep":
			fmt.Fprintf(os.Stderr, "gofn: holding %s\n", r.Body())
			if strings.HasPrefix(string(r.Body()), "hold") {
				time.Sleep(time.Minute)
			} else {
				time.Sleep(2 * time.Second)
			}
			upper(r.Body())
			return zerohop.Continue, nil
		}
		return zerohop.Continue, fmt.Errorf("unknown GOFN_MODE %q", mode)
	})
}
