// Package zerohop is the Go SDK of zerohop functions: a handler sees the request's body in
// place in the chain's shared memory, changes it there or replaces it, calls other
// functions, uses the chain's state, and returns where the request goes next.
//
//	func main() {
//		zerohop.Run(func(r *zerohop.Request) (zerohop.Next, error) {
//			b := r.Body()
//			for i, c := range b {
//				if 'a' <= c && c <= 'z' {
//					b[i] = c - 32
//				}
//			}
//			return zerohop.Continue, nil
//		})
//	}
//
// The package is cgo over the C SDK (libzerohop, itself the Rust runtime behind a C ABI),
// so a Go function runs the same protocol code as a Rust or C one. Build with the C SDK
// installed (`cargo xtask c-sdk`) and PKG_CONFIG_PATH pointing at its pkgconfig folder.
//
// Slices into the request (Body, an Answer's Body) are valid until the handler returns
// (an Answer's: until Close), and Body's until the body is resized or moved up by
// AddResponseHeader: keep copies, never the slices. With `concurrency` above 1 in
// the chain spec the handler runs on several threads at once.
package zerohop

/*
#cgo pkg-config: zerohop-static
#include <stdlib.h>
#include <zerohop.h>

extern zh_next zhGoHandle(zh_request *req, void *user);

static void zh_go_run(uintptr_t handle) { zh_run(zhGoHandle, (void *)handle); }
*/
import "C"

import (
	"fmt"
	"net/url"
	"runtime/cgo"
	"sort"
	"strings"
	"unsafe"
)

// Next says where a request goes after the handler.
type Next struct {
	kind    C.zh_next
	forward string
}

var (
	// Continue sends the request on along its route (to the client after the last
	// function).
	Continue = Next{kind: C.ZH_CONTINUE}
	// Reply sends the request straight back to the client.
	Reply = Next{kind: C.ZH_REPLY}
)

// Forward sends the request on to function (one of this function's `next` in the spec).
func Forward(function string) Next { return Next{kind: C.ZH_FORWARD, forward: function} }

// Error is a handler's error with the status the client gets (400 to 599; anything else
// is 500). Any other error a handler returns is a 500 with its text.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Message) }

// Handler handles one request.
type Handler func(r *Request) (Next, error)

// Request is one request, valid during one call of the handler.
type Request struct {
	r *C.zh_request
}

// Run serves requests with h until the agent stops the instance; it never returns. A
// program not started by the agent exits with status 2 and says why.
func Run(h Handler) {
	handle := cgo.NewHandle(h)
	C.zh_go_run(C.uintptr_t(handle))
}

// RunNamed serves requests with the handler registered for each request's function
// (Request.Function) until the agent stops the instance; it never returns. That is how one
// program serves a fused group (`fuse:` in the chain spec): the instance calls each step's
// handler in turn on the same request, in place. A function without a handler here fails
// its requests with a 500 naming it.
func RunNamed(handlers map[string]Handler) {
	names := make([]string, 0, len(handlers))
	for name := range handlers {
		names = append(names, name)
	}
	sort.Strings(names)
	Run(func(r *Request) (Next, error) {
		h, ok := handlers[r.Function()]
		if !ok {
			return Continue, &Error{
				Status: 500,
				Message: fmt.Sprintf("this program registers no handler for function `%s` (it has: %s)",
					r.Function(), strings.Join(names, ", ")),
			}
		}
		return h(r)
	})
}

//export zhGoHandle
func zhGoHandle(req *C.zh_request, user unsafe.Pointer) C.zh_next {
	h := cgo.Handle(uintptr(user)).Value().(Handler)
	r := &Request{r: req}
	next, err := call(h, r)
	if err != nil {
		status, message := 500, err.Error()
		if e, ok := err.(*Error); ok {
			status, message = e.Status, e.Message
		}
		cmsg := C.CString(message)
		defer C.free(unsafe.Pointer(cmsg))
		return C.zh_next(C.zh_fail(req, C.uint16_t(clampStatus(status)), cmsg))
	}
	if next.kind == C.ZH_FORWARD {
		cname := C.CString(next.forward)
		defer C.free(unsafe.Pointer(cname))
		return C.zh_next(C.zh_forward(req, cname))
	}
	return next.kind
}

// call runs the handler, turning a panic into a 500 naming it (the instance serves on).
func call(h Handler, r *Request) (next Next, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &Error{Status: 500, Message: fmt.Sprintf("panic: %v", p)}
		}
	}()
	return h(r)
}

func clampStatus(s int) int {
	if s < 400 || s > 599 {
		return 500
	}
	return s
}

// lastError is the SDK's message for the status it returned.
func (r *Request) lastError(status C.uint16_t) error {
	return &Error{Status: int(status), Message: C.GoString(C.zh_last_error(r.r))}
}

func bytesPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// Body is the request's body, writable in place in shared memory (no copy). Valid until
// the handler returns or the body is resized.
func (r *Request) Body() []byte {
	var n C.size_t
	p := C.zh_body(r.r, &n)
	if p == nil || n == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(p)), int(n))
}

// Capacity is the most bytes the body may grow to in place; beyond, SetLen, SetBody and
// Extend move the request into a large slot (up to the chain's max_body).
func (r *Request) Capacity() int { return int(C.zh_capacity(r.r)) }

// SetLen resizes the body (new bytes are whatever the slot held).
func (r *Request) SetLen(n int) error {
	if rc := C.zh_set_len(r.r, C.size_t(n)); rc != 0 {
		return r.lastError(rc)
	}
	return nil
}

// SetBody replaces the body with b (copied into the slot).
func (r *Request) SetBody(b []byte) error {
	if rc := C.zh_set_body(r.r, bytesPtr(b), C.size_t(len(b))); rc != 0 {
		return r.lastError(rc)
	}
	return nil
}

// Extend appends b to the body.
func (r *Request) Extend(b []byte) error {
	if rc := C.zh_extend(r.r, bytesPtr(b), C.size_t(len(b))); rc != 0 {
		return r.lastError(rc)
	}
	return nil
}

// ID is the gateway's id of the request.
func (r *Request) ID() uint32 { return uint32(C.zh_request_id(r.r)) }

func goString(p *C.char, n C.size_t) string {
	if p == nil {
		return ""
	}
	return C.GoStringN(p, C.int(n))
}

// Function is this function's name.
func (r *Request) Function() string {
	var n C.size_t
	return goString(C.zh_function(r.r, &n), n)
}

// Method is the HTTP method of the route the request came in by.
func (r *Request) Method() string {
	var n C.size_t
	return goString(C.zh_method(r.r, &n), n)
}

// Path is the request's path: as the client sent it (percent-encoded) when a function of
// the chain lists ":path" in its `headers`, else the route's path as the spec writes it
// (RoutePath).
func (r *Request) Path() string {
	var n C.size_t
	return goString(C.zh_path(r.r, &n), n)
}

// RoutePath is the path of the route the request came in by, as the spec writes it
// ("/item/{id}", "/static/{*rest}").
func (r *Request) RoutePath() string {
	var n C.size_t
	return goString(C.zh_route_path(r.r, &n), n)
}

// Param is the route's path parameter name ("id" for "GET /item/{id}", "rest" for a
// trailing "*"), percent-decoded. Parameters always arrive, listed in `headers` or not.
func (r *Request) Param(name string) (string, bool) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var n C.size_t
	p := C.zh_param(r.r, cname, &n)
	if p == nil {
		return "", false
	}
	return goString(p, n), true
}

// QueryString is the query string as the client sent it (after "?", not decoded), when a
// function of the chain lists ":query" in its `headers` and the request had one.
func (r *Request) QueryString() (string, bool) {
	var n C.size_t
	p := C.zh_query_string(r.r, &n)
	if p == nil {
		return "", false
	}
	return goString(p, n), true
}

// Query is the first value of query parameter name, decoded by net/url's ParseQuery, when
// a function of the chain lists ":query" in its `headers` and the client sent it.
func (r *Request) Query(name string) (string, bool) {
	raw, ok := r.QueryString()
	if !ok {
		return "", false
	}
	// ParseQuery keeps what it could parse beside an error (a bad escape, a ';'): the
	// other parameters are still there.
	values, _ := url.ParseQuery(raw)
	v, ok := values[name]
	if !ok || len(v) == 0 {
		return "", false
	}
	return v[0], true
}

// Cookie is the value of cookie name from the request's Cookie headers, when a function of
// the chain lists "cookie" in its `headers`.
func (r *Request) Cookie(name string) (string, bool) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var n C.size_t
	p := C.zh_cookie(r.r, cname, &n)
	if p == nil {
		return "", false
	}
	return goString(p, n), true
}

// AddResponseHeader adds the header name: value to the client's answer (HTTP only), e.g.
// Location with a 303 or Set-Cookie; a Content-Type replaces the route's. Refused with an
// *Error (500, nothing changed): a name that is not a header name or one the gateway sets
// (Content-Length, Connection, ...), a value with a line break, a 65th header, one that does
// not fit the slot beside the body. The header rides in the slot before the body, which
// moves up: a slice from Body is stale afterwards (call Body again).
func (r *Request) AddResponseHeader(name, value string) error {
	cname, cvalue := C.CString(name), C.CString(value)
	defer C.free(unsafe.Pointer(cname))
	defer C.free(unsafe.Pointer(cvalue))
	if rc := C.zh_add_response_header(r.r, cname, cvalue); rc != 0 {
		return r.lastError(rc)
	}
	return nil
}

// SetStatus sets the answer's status for the client: 200 (the default) to 399, except 204,
// 205 and 304 (an error is a returned *Error); anything else is refused with an *Error (500,
// nothing changed). With a 3xx, add a Location (AddResponseHeader).
func (r *Request) SetStatus(status int) error {
	if status < 0 || status > 0xffff {
		status = 0 // refused below like any status out of range, not wrapped into one
	}
	if rc := C.zh_set_status(r.r, C.uint16_t(status)); rc != 0 {
		return r.lastError(rc)
	}
	return nil
}

// Header is the request header name (case-insensitive), if the spec lists it under the
// function's `headers` and the client sent it.
func (r *Request) Header(name string) (string, bool) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var n C.size_t
	p := C.zh_header(r.r, cname, &n)
	if p == nil {
		return "", false
	}
	return goString(p, n), true
}

// Answer is the answer of a call: its callee's output read in place, or the call's error.
type Answer struct {
	a     *C.zh_answer
	owned bool
}

// Status is 200 when the callee gave an output, else the call's error status (the
// callee's own, 502 if it died, 504 if it did not answer in time, 503 if it could not be
// reached, 500 if this function may not call it).
func (a Answer) Status() int { return int(C.zh_answer_status(a.a)) }

// Body is the callee's output (status 200) or the error's message; valid until Close
// (for a branch: until the handler returns).
func (a Answer) Body() []byte {
	var n C.size_t
	p := C.zh_answer_body(a.a, &n)
	if p == nil || n == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(p)), int(n))
}

// Err is nil for status 200, else the call's error.
func (a Answer) Err() error {
	if s := a.Status(); s != 200 {
		return &Error{Status: s, Message: string(a.Body())}
	}
	return nil
}

// Close frees the answer and the callee's slot (a no-op for a branch).
func (a Answer) Close() {
	if a.owned && a.a != nil {
		C.zh_answer_free(a.a)
	}
}

// Call is one call of CallAll.
type Call struct {
	Function string
	Input    []byte
}

// Call calls function (one of this function's `calls`) with input and waits for its
// answer (at most the chain's timeout). Close the answer when done with its body.
func (r *Request) Call(function string, input []byte) Answer {
	return r.CallAll([]Call{{function, input}})[0]
}

// CallAll makes the calls at once (fan-out) and waits until every one answered (fan-in);
// answers in the order of calls.
func (r *Request) CallAll(calls []Call) []Answer {
	if len(calls) == 0 {
		return nil
	}
	n := len(calls)
	// The specs and the names live in C memory: Go memory passed to C must hold no Go
	// pointers.
	specs := unsafe.Slice((*C.zh_call_spec)(C.malloc(C.size_t(n)*C.size_t(unsafe.Sizeof(C.zh_call_spec{})))), n)
	inputs := make([]unsafe.Pointer, n)
	for i, c := range calls {
		specs[i].function = C.CString(c.Function)
		inputs[i] = C.CBytes(c.Input)
		specs[i].input = inputs[i]
		specs[i].len = C.size_t(len(c.Input))
	}
	out := unsafe.Slice((**C.zh_answer)(C.malloc(C.size_t(n)*C.size_t(unsafe.Sizeof((*C.zh_answer)(nil))))), n)
	C.zh_call_all(r.r, &specs[0], C.size_t(n), &out[0])
	answers := make([]Answer, n)
	for i := range calls {
		answers[i] = Answer{a: out[i], owned: true}
		C.free(unsafe.Pointer(specs[i].function))
		C.free(inputs[i])
	}
	C.free(unsafe.Pointer(&specs[0]))
	C.free(unsafe.Pointer(&out[0]))
	return answers
}

// Branches are the answers of the static fan-out this function joins, in the spec's
// `fan_out` order (empty for a function that joins none).
func (r *Request) Branches() []Answer {
	n := int(C.zh_branches(r.r))
	out := make([]Answer, n)
	for i := range out {
		out[i] = Answer{a: (*C.zh_answer)(unsafe.Pointer(C.zh_branch(r.r, C.size_t(i))))}
	}
	return out
}

// StateGet reads key from the chain's state store (the function needs `state: true`):
// the value (a copy) and whether it was there.
func (r *Request) StateGet(key []byte) ([]byte, bool, error) {
	buf := make([]byte, 256)
	for {
		var n C.size_t
		rc := C.zh_state_get(r.r, bytesPtr(key), C.size_t(len(key)), bytesPtr(buf), C.size_t(len(buf)), &n)
		switch {
		case rc == 0:
			return nil, false, nil
		case rc > 1:
			return nil, false, r.lastError(rc)
		case int(n) > len(buf):
			buf = make([]byte, int(n))
		default:
			return buf[:n], true, nil
		}
	}
}

// StatePut sets key to value in the chain's state store.
func (r *Request) StatePut(key, value []byte) error {
	if rc := C.zh_state_put(r.r, bytesPtr(key), C.size_t(len(key)), bytesPtr(value), C.size_t(len(value))); rc != 0 {
		return r.lastError(rc)
	}
	return nil
}

// StateDelete removes key from the chain's state store; whether it was there.
func (r *Request) StateDelete(key []byte) (bool, error) {
	rc := C.zh_state_delete(r.r, bytesPtr(key), C.size_t(len(key)))
	if rc > 1 {
		return false, r.lastError(rc)
	}
	return rc == 1, nil
}
