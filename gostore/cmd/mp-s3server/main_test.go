package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/backup/backuptest"
	"github.com/millpond/millpond/gostore/backup/s3backup"
)

var listenLine = regexp.MustCompile(`^listening on (http://127\.0\.0\.1:\d+)\n$`)

func TestRunServesBucketsUntilCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-bucket", "one-bucket", "-bucket", "two-bucket"}, pw, io.Discard) }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	m := listenLine.FindStringSubmatch(line)
	require.NotNil(t, m, "first line %q", line)

	for _, bucket := range []string{"one-bucket", "two-bucket"} {
		b, err := s3backup.New(context.Background(), s3backup.Options{
			Bucket: bucket, Endpoint: m[1], Region: "us-east-1",
			AccessKeyID: "id", SecretAccessKey: "secret",
		})
		require.NoError(t, err)
		require.NoError(t, b.Check(context.Background()))
		backuptest.Put(t, b, "k", []byte(bucket))
		assert.Equal(t, bucket, string(backuptest.Get(t, b, "k")))
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("server did not stop")
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"UnknownFlag", []string{"-nope"}, "not defined"},
		{"ExtraArgument", []string{"extra"}, "unexpected arguments"},
		{"BadBucket", []string{"-bucket", "x"}, `create bucket "x"`},
		{"BadAddr", []string{"-addr", "127.0.0.1:notaport"}, "listen on"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A bad flag must fail before serving; the timeout stops a
			// server that started anyway.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := run(ctx, tt.args, io.Discard, io.Discard)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

// TestBinaryExitsCleanlyOnSIGTERM builds the command and checks the
// contract the Python tests rely on: one line on stdout, exit 0 on SIGTERM.
func TestBinaryExitsCleanlyOnSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	bin := filepath.Join(t.TempDir(), "mp-s3server")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())

	cmd := exec.Command(bin, "-bucket", "millpond")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Regexp(t, listenLine, line)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	rest, err := io.ReadAll(stdout)
	require.NoError(t, err)
	assert.Empty(t, strings.TrimSpace(string(rest)), "nothing else on stdout")
	require.NoError(t, cmd.Wait())
}

// TestConditionalPutsOfOneKeyExactlyOneWins sends many raw PUTs with
// "If-None-Match: *" of one key at once: the server (gofakes3, which checks
// the condition under its backend's lock) must let exactly one through
// with 200 and refuse the rest with 412 PreconditionFailed, as S3 does.
func TestConditionalPutsOfOneKeyExactlyOneWins(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-bucket", "cond-bucket"}, pw, io.Discard) }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	m := listenLine.FindStringSubmatch(line)
	require.NotNil(t, m, "first line %q", line)

	// No keep-alive: a connection the client dialed and left unused counts
	// as busy for the server's shutdown, which then waits for it.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	const n = 32
	for round := range 3 {
		url := fmt.Sprintf("%s/cond-bucket/race/%d", m[1], round)
		statuses := make([]int, n)
		bodies := make([]string, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				req, err := http.NewRequest(http.MethodPut, url, strings.NewReader(fmt.Sprintf("writer %d", i)))
				if !assert.NoError(t, err) {
					return
				}
				req.Header.Set("If-None-Match", "*")
				resp, err := client.Do(req)
				if !assert.NoError(t, err) {
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				statuses[i], bodies[i] = resp.StatusCode, string(body)
			}()
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, st := range statuses {
			switch st {
			case http.StatusOK:
				assert.Equal(t, -1, winner, "two conditional PUTs succeeded")
				winner = i
			case http.StatusPreconditionFailed:
				assert.Contains(t, bodies[i], "<Code>PreconditionFailed</Code>")
			default:
				t.Errorf("writer %d: status %d: %s", i, st, bodies[i])
			}
		}
		require.NotEqual(t, -1, winner)
		resp, err := client.Get(url)
		require.NoError(t, err)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, fmt.Sprintf("writer %d", winner), string(got))
	}
	cancel()
	require.NoError(t, <-done)
}
