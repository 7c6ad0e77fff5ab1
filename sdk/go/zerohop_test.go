package zerohop_test

// End to end: Go functions built from internal/testfn run in a chain by the real
// `zerohop up` (target/release/zerohop, or $ZEROHOP_BIN), answered over real HTTP.

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// chain is a running `zerohop up`.
type chain struct {
	cmd *exec.Cmd
	url string
	// The lines it writes to standard error (its own and, echoed as
	// "[function/instance] text", every instance's), each passed on to the test's too.
	stderr chan string
}

func zerohopBin(t *testing.T) string {
	if b := os.Getenv("ZEROHOP_BIN"); b != "" {
		return b
	}
	b, err := filepath.Abs("../../target/release/zerohop")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b); err != nil {
		t.Fatalf("%s is missing: `cargo build --release` (cargo xtask test does), or set ZEROHOP_BIN", b)
	}
	return b
}

// buildTestfn builds internal/testfn into dir.
func buildTestfn(t *testing.T, dir string) string {
	out := filepath.Join(dir, "testfn")
	cmd := exec.Command("go", "build", "-buildvcs=false", "-o", out, "./internal/testfn")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go build ./internal/testfn: %v", err)
	}
	return out
}

var ready = regexp.MustCompile(`ready at (http://[0-9.:]+)`)

// start runs `zerohop up` on spec (a free port) and waits at most 30 s for its ready line
// (on its standard output);
// the chain is stopped when the test ends, also when it fails.
func start(t *testing.T, dir, spec string) *chain {
	file := filepath.Join(dir, "chain.yaml")
	if err := os.WriteFile(file, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(zerohopBin(t), "up", file, "--listen", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &chain{cmd: cmd, stderr: make(chan string, 4096)}
	go func() {
		s := bufio.NewScanner(stderr)
		s.Buffer(make([]byte, 64<<10), 1<<20)
		for s.Scan() {
			fmt.Fprintln(os.Stderr, s.Text())
			// Lines no test waits for pile up: a full buffer lets its oldest go rather
			// than hold up the chain.
			for sent := false; !sent; {
				select {
				case c.stderr <- s.Text():
					sent = true
				default:
					select {
					case <-c.stderr:
					default:
					}
				}
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	urls := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			if m := ready.FindStringSubmatch(s.Text()); m != nil {
				urls <- m[1]
			}
		}
	}()
	select {
	case c.url = <-urls:
	case <-time.After(30 * time.Second):
		t.Fatal("zerohop up was not ready within 30 s")
	}
	return c
}

// waitFor waits at most guard for a line of the chain's standard error containing marker
// (lines before it are passed over); the test fails saying what never happened when none
// comes.
func (c *chain) waitFor(t *testing.T, marker string, guard time.Duration, what string) {
	t.Helper()
	deadline := time.After(guard)
	for {
		select {
		case line := <-c.stderr:
			if strings.Contains(line, marker) {
				return
			}
		case <-deadline:
			t.Fatalf("%s never happened: the chain wrote no line with %q within %v", what, marker, guard)
		}
	}
}

// post sends body to url and returns the answer; it fails the test on an error, so call it
// from the test's goroutine only (tryPost from others).
func post(t *testing.T, url, body string, header ...string) (int, string) {
	t.Helper()
	s, b, err := tryPost(url, body, header...)
	if err != nil {
		t.Fatal(err)
	}
	return s, b
}

// tryPost sends body to url (within 30 s) and returns the answer or what went wrong.
func tryPost(url, body string, header ...string) (int, string, error) {
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	if len(header) == 2 {
		req.Header.Set(header[0], header[1])
	}
	client := http.Client{Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", fmt.Errorf("POST %s: reading the answer: %w", url, err)
	}
	return resp.StatusCode, string(b), nil
}

func fn(bin, name, mode, env, fields string) string {
	return fmt.Sprintf("  %s: { command: [%q], env: { GOFN_MODE: %s%s }%s }\n", name, bin, mode, env, fields)
}

func expect(t *testing.T, what string, gotStatus int, got string, status int, want string) {
	t.Helper()
	if gotStatus != status || got != want {
		t.Errorf("%s: got %d %q, want %d %q", what, gotStatus, got, status, want)
	}
}

func TestGoFunctions(t *testing.T) {
	dir := t.TempDir()
	bin := buildTestfn(t, dir)
	spec := "name: gosdk\nstate: { entries: 16, value_size: 64 }\nfunctions:\n" +
		fn(bin, "up", "upper", "", "") +
		fn(bin, "bang", "exclaim", "", "") +
		fn(bin, "no", "fail", "", "") +
		fn(bin, "boom", "panic", "", "") +
		fn(bin, "caller", "call", ", GOFN_CALLS: \"up,no\"", ", calls: [up, no]") +
		fn(bin, "count", "count", "", ", state: true") +
		fn(bin, "hdr", "header", "", ", headers: [X-Test]") +
		fn(bin, "fwd", "forward", ", GOFN_TARGET: up", ", next: [up]") +
		"routes:\n" +
		"  - http: POST /hello\n    sequence: [up, bang]\n" +
		"  - http: POST /no\n    sequence: [no]\n" +
		"  - http: POST /boom\n    sequence: [boom]\n" +
		"  - http: POST /call\n    sequence: [caller]\n" +
		"  - http: POST /count\n    sequence: [count]\n" +
		"  - http: POST /hdr\n    sequence: [hdr]\n" +
		"  - http: POST /fwd\n    sequence: [fwd]\n"
	c := start(t, dir, spec)
	s, b := post(t, c.url+"/hello", "hello from go")
	expect(t, "in place, then appended", s, b, 200, "HELLO FROM GO!")
	s, b = post(t, c.url+"/no", "this")
	expect(t, "an Error", s, b, 422, "function 'no': refusing this\n")
	s, b = post(t, c.url+"/boom", "x")
	expect(t, "a panic", s, b, 500, "function 'boom': panic: boom\n")
	s, b = post(t, c.url+"/boom", "y")
	expect(t, "a panic again (the instance serves on)", s, b, 500, "function 'boom': panic: boom\n")
	s, b = post(t, c.url+"/call", "ab")
	expect(t, "calls", s, b, 200, "up=AB;no!422;")
	for i := 1; i <= 3; i++ {
		s, b = post(t, c.url+"/count", "visits")
		expect(t, "state", s, b, 200, strconv.Itoa(i))
	}
	s, b = post(t, c.url+"/hdr", "", "X-Test", "from the client")
	expect(t, "a header", s, b, 200, "from the client")
	s, b = post(t, c.url+"/fwd", "forwarded")
	expect(t, "forward", s, b, 200, "FORWARDED")
}

// TestRouteParametersQueryCookiesAndAnswerHeaders: a Go function on GET /item/{id} reads the
// parameter, the path, the query and a cookie, and answers 303 with headers of its own, as
// net/http sees it (redirects not followed).
func TestRouteParametersQueryCookiesAndAnswerHeaders(t *testing.T) {
	dir := t.TempDir()
	bin := buildTestfn(t, dir)
	spec := "name: gosdk3\nfunctions:\n" +
		fn(bin, "item", "item", "", `, headers: [":path", ":query", cookie]`) +
		"routes:\n  - http: GET /item/{id}\n    sequence: [item]\n"
	c := start(t, dir, spec)
	client := http.Client{
		Timeout:       30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	get := func(path, cookie string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest("GET", c.url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if cookie != "" {
			req.Header.Set("Cookie", cookie)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, string(b)
	}
	resp, body := get("/item/42?q=caf%C3%A9+au+lait&n=1", "other=x; session=s-1")
	expect(t, "GET /item/42", resp.StatusCode, body, 303,
		"path=/item/42 route=/item/{id} id=42 query=q=caf%C3%A9+au+lait&n=1 q=café au lait "+
			"session=s-1 refused=500: `Content-Length` is set by the gateway, not by functions "+
			"status404=500: status 404 is not one a function answers with: 200..=399 but 204, "+
			"205 and 304 (an error status is answered by failing the request)")
	if got := resp.Header.Values("Location"); len(got) != 1 || got[0] != "/item/42/done" {
		t.Errorf("Location: %q", got)
	}
	if got := resp.Header.Values("Set-Cookie"); len(got) != 1 || got[0] != "seen=42; Path=/" {
		t.Errorf("Set-Cookie: %q", got)
	}
	// Without a query or cookies: absent, not empty; the parameter is there all the same.
	resp, body = get("/item/7", "")
	if resp.StatusCode != 303 || !strings.HasPrefix(body, "path=/item/7 route=/item/{id} id=7 query=- q=- session=- ") {
		t.Errorf("GET /item/7: got %d %q", resp.StatusCode, body)
	}
}

// instances are the chain's instance processes: the children of `zerohop up` but its
// spawner.
func instances(t *testing.T, pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		s := string(stat)
		end := strings.LastIndexByte(s, ')')
		fields := strings.Fields(s[end+2:])
		comm := s[strings.IndexByte(s, '(')+1 : end]
		if ppid, _ := strconv.Atoi(fields[1]); ppid == pid && comm != "zerohop-spawner" {
			out = append(out, p)
		}
	}
	return out
}

// cpuTicks is utime + stime of pid, in clock ticks; a stat it cannot read fails the test
// (a parse error must not read as "no CPU used").
func cpuTicks(t *testing.T, pid int) int {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	ticks, err := parseTicks(string(stat))
	if err != nil {
		t.Fatalf("/proc/%d/stat: %v", pid, err)
	}
	return ticks
}

// parseTicks is utime + stime of a /proc/PID/stat line.
func parseTicks(stat string) (int, error) {
	end := strings.LastIndexByte(stat, ')')
	if end < 0 || end+2 > len(stat) {
		return 0, fmt.Errorf("no ')' closing the command name in %q", stat)
	}
	fields := strings.Fields(stat[end+2:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want at least 13: %q", len(fields), stat)
	}
	u, err := strconv.Atoi(fields[11])
	if err != nil {
		return 0, fmt.Errorf("utime: %w", err)
	}
	k, err := strconv.Atoi(fields[12])
	if err != nil {
		return 0, fmt.Errorf("stime: %w", err)
	}
	return u + k, nil
}

func TestParseTicks(t *testing.T) {
	// pid (comm with ") ") state ppid ... utime=7 stime=5 ...
	line := "42 (a) b) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0 100 0 0"
	if got, err := parseTicks(line); err != nil || got != 12 {
		t.Errorf("parseTicks: got %d, %v; want 12", got, err)
	}
	for _, bad := range []string{"", "42 (a) S 1", "42 (a) S 1 42 42 0 -1 4194560 100 0 0 0 x 5 0"} {
		if got, err := parseTicks(bad); err == nil {
			t.Errorf("parseTicks(%q) = %d, want an error", bad, got)
		}
	}
}

func TestIdleAndKilled(t *testing.T) {
	dir := t.TempDir()
	bin := buildTestfn(t, dir)
	spec := "name: gosdk2\ntimeout: 10s\nfunctions:\n" + fn(bin, "slow", "sleep", "", "") +
		"routes:\n  - http: POST /slow\n    sequence: [slow]\n"
	c := start(t, dir, spec)
	pids := instances(t, c.cmd.Process.Pid)
	if len(pids) != 1 {
		t.Fatalf("one instance expected: %v", pids)
	}
	// Idle for 2 s: at most a tick or two (100 ticks a second).
	before := cpuTicks(t, pids[0])
	time.Sleep(2 * time.Second)
	if used := cpuTicks(t, pids[0]) - before; used > 3 {
		t.Errorf("an idle Go instance used %d ticks in 2 s", used)
	}
	// Killed in the middle of a request: answered 502, restarted, serving again.
	type answer struct {
		status int
		body   string
		err    error
	}
	// The request's goroutine reports back; only this one may end the test. The function
	// says when it holds the request, and holds it a minute: only the kill ends it within
	// the chain's timeout.
	got := make(chan answer, 1)
	go func() {
		s, b, err := tryPost(c.url+"/slow", "hold")
		got <- answer{s, b, err}
	}()
	c.waitFor(t, "gofn: holding hold", 30*time.Second, "the Go instance holding the request")
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// tryPost gives up after 30 s; this guard only keeps a hang from lasting the whole run.
	select {
	case a := <-got:
		if a.err != nil {
			t.Fatalf("killed mid-request: %v", a.err)
		}
		if a.status != 502 {
			t.Errorf("killed mid-request: got %d %q, want 502", a.status, a.body)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("killed mid-request: no answer within 60 s")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		now := instances(t, c.cmd.Process.Pid)
		if len(now) == 1 && now[0] != pids[0] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new instance within 10 s: %v", now)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s, b := post(t, c.url+"/slow", "again")
	expect(t, "after the restart", s, b, 200, "AGAIN")
}

// TestFusedGroup: upper and exclaim of one Go program (internal/fusedfn, RunNamed) fused
// (`fuse: [[upper, exclaim]]`): one instance runs both steps; an error in the second names it.
func TestFusedGroup(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "fusedfn")
	cmd := exec.Command("go", "build", "-buildvcs=false", "-o", bin, "./internal/fusedfn")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go build ./internal/fusedfn: %v", err)
	}
	spec := "name: gofused\nfunctions:\n" +
		"  upper: { command: [\"" + bin + "\"] }\n" +
		"  exclaim: { command: [\"" + bin + "\"] }\n" +
		"routes:\n  - http: POST /hello\n    sequence: [upper, exclaim]\n" +
		"fuse:\n  - [upper, exclaim]\n"
	c := start(t, dir, spec)
	s, b := post(t, c.url+"/hello", "hello fused")
	expect(t, "both steps", s, b, 200, "HELLO FUSED!")
	s, b = post(t, c.url+"/hello", "no")
	expect(t, "an error in the second step", s, b, 422, "function 'exclaim': refusing exclaim\n")
}
