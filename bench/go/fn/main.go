// zerohop-bench-go: the Go baselines of the benchmark's multi-core point, standard library
// only. The same interface as zerohop-bench-fn (the hyper baselines): it applies its steps
// to the request body and either answers with the result (the Go monolith, the last hop of
// the Go HTTP chain) or POSTs it to the next hop over a keep-alive connection and relays that
// answer (the Go HTTP chain). Prints `listening on http://ADDR` as its first stdout line once
// it accepts connections; SIGTERM ends it. GOMAXPROCS is set by the caller.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// Largest request body (and next hop's answer) accepted, as in zerohop-bench-fn.
const maxBody = 300 << 20

type server struct {
	steps  []string
	next   string
	client *http.Client
}

func apply(step string, body []byte) []byte {
	switch step {
	case "upper":
		for i, b := range body {
			if b >= 'a' && b <= 'z' {
				body[i] = b - ('a' - 'A')
			}
		}
	case "exclaim":
		body = append(body, '!')
	}
	return body
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		http.Error(w, "cannot read the request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(body) > maxBody {
		http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
		return
	}
	for _, step := range s.steps {
		body = apply(step, body)
	}
	// A set Content-Type spares the server sniffing every answer.
	w.Header().Set("Content-Type", "application/octet-stream")
	if s.next == "" {
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		w.Write(body)
		return
	}
	resp, err := s.client.Post(s.next, "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		http.Error(w, "next hop "+s.next+" failed: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		http.Error(w, "next hop "+s.next+" failed: "+err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Length", fmt.Sprint(len(answer)))
	w.WriteHeader(resp.StatusCode)
	w.Write(answer)
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (port 0: any free port)")
	steps := flag.String("steps", "", "steps applied in order: upper, exclaim, pass (comma separated)")
	next := flag.String("next", "", "POST the result here and answer with its answer")
	flag.Parse()
	s := &server{next: *next}
	for _, step := range strings.Split(*steps, ",") {
		switch step {
		case "upper", "exclaim", "pass":
			s.steps = append(s.steps, step)
		default:
			fmt.Fprintf(os.Stderr, "zerohop-bench-go: unknown step %q; known: upper, exclaim, pass\n", step)
			os.Exit(2)
		}
	}
	if s.next != "" {
		// Keep-alive connections to the next hop, as many idle ones as requests in flight.
		transport := &http.Transport{
			MaxIdleConns:        4096,
			MaxIdleConnsPerHost: 4096,
			IdleConnTimeout:     90 * time.Second,
		}
		s.client = &http.Client{Transport: transport, Timeout: 30 * time.Second}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "zerohop-bench-go: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("listening on http://%s\n", ln.Addr())
	os.Stdout.Sync()
	// Go sets TCP_NODELAY on accepted and dialled connections by default.
	if err := http.Serve(ln, s); err != nil {
		fmt.Fprintf(os.Stderr, "zerohop-bench-go: %v\n", err)
		os.Exit(1)
	}
}
