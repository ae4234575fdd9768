// Command bodyburst measures what unfinished uploads cost a running
// router: it opens n uploads of size bytes each to addr, sends all but the
// last byte of every one, or -send bytes (a client that never finishes),
// samples the router's resident memory (/proc/PID/status VmRSS), Go heap
// and held body bytes (its /metrics), sends one whole request and prints
// its answer, then closes the uploads and samples again at 1 s, 10 s, 60 s
// and 180 s. run.sh starts a router and runs it.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

func rss(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			return strings.TrimSpace(strings.TrimPrefix(l, "VmRSS:"))
		}
	}
	return "?"
}

func metric(url, name string) string {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return "?"
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), name+" ") {
			return strings.TrimPrefix(sc.Text(), name+" ")
		}
	}
	return "-"
}

func main() {
	addr := flag.String("addr", "127.0.0.1:18080", "")
	n := flag.Int("n", 64, "")
	size := flag.Int("size", 31<<20, "")
	pid := flag.Int("pid", 0, "")
	send := flag.Int("send", 0, "bytes of each body sent (0: all but the last)")
	flag.Parse()
	if *send <= 0 || *send >= *size {
		*send = *size - 1
	}
	url := "http://" + *addr
	sample := func(what string) {
		fmt.Printf("%-28s rss=%-12s heap_inuse=%-14s heap_sys=%-14s body_held=%s\n", what, rss(*pid),
			metric(url, "go_memstats_heap_inuse_bytes"), metric(url, "go_memstats_heap_sys_bytes"), metric(url, "kvrouter_proxy_body_held_bytes"))
	}
	sample("before")
	start := time.Now()
	body := bytes.Repeat([]byte("a"), *send)
	copy(body, `{"model":"m","messages":[{"role":"user","content":"`)
	var wg sync.WaitGroup
	var mu sync.Mutex
	status := map[string]int{}
	conns := make([]net.Conn, *n)
	for i := range *n {
		c, err := net.Dial("tcp", *addr)
		if err != nil {
			panic(err)
		}
		conns[i] = c
		wg.Add(1)
		go func() {
			defer wg.Done()
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", *size)
			_ = c.SetWriteDeadline(time.Now().Add(60 * time.Second))
			_, err := c.Write(body)
			st := "written"
			if err != nil {
				st = "write-refused"
			}
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				io.Copy(io.Discard, resp.Body)
				st = fmt.Sprintf("answered-%d", resp.StatusCode)
			}
			mu.Lock()
			status[st]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	fmt.Printf("uploads: %v after %.1fs\n", status, time.Since(start).Seconds())
	sample("uploads held")
	// A whole request meanwhile: its answer (the engine is unreachable,
	// so anything but the body budget's 503 means its body was read).
	if resp, err := (&http.Client{Timeout: 10 * time.Second}).Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("a whole request meanwhile: %d %.120s\n", resp.StatusCode, b)
	} else {
		fmt.Printf("a whole request meanwhile: %v\n", err)
	}
	for _, c := range conns {
		c.Close()
	}
	t0 := time.Now()
	for _, d := range []time.Duration{time.Second, 10 * time.Second, 60 * time.Second, 180 * time.Second} {
		time.Sleep(time.Until(t0.Add(d)))
		sample(fmt.Sprintf("closed +%v", d))
	}
}
