// Command mp-s3server serves the S3 protocol from memory, for tests.
//
//	mp-s3server -addr 127.0.0.1:0 -bucket millpond -bucket other
//
// It creates the given buckets, prints exactly one line
// "listening on http://127.0.0.1:PORT" to stdout once it accepts
// connections, and exits cleanly (status 0) on SIGTERM or SIGINT. Everything
// is lost when it exits. It uses gofakes3, which does not check request
// signatures: any credentials work. A PUT with "If-None-Match: *" is
// refused with 412 PreconditionFailed if the key exists, atomically
// (gofakes3 v1.2 checks the condition under its backend's lock; a test
// races many such PUTs of one key), as backup.Small's Create needs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "mp-s3server:", err)
		os.Exit(1)
	}
}

// bucketList collects repeated -bucket flags.
type bucketList []string

func (b *bucketList) String() string     { return strings.Join(*b, ",") }
func (b *bucketList) Set(v string) error { *b = append(*b, v); return nil }

// run serves until ctx is done, then shuts down gracefully.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mp-s3server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "address to listen on (port 0 picks a free port)")
	verbose := fs.Bool("v", false, "log every request to stderr")
	var buckets bucketList
	fs.Var(&buckets, "bucket", "bucket to create (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))

	mem := s3mem.New()
	for _, b := range buckets {
		if err := gofakes3.ValidateBucketName(b); err != nil {
			return fmt.Errorf("create bucket %q: %w", b, err)
		}
		if err := mem.CreateBucket(b); err != nil {
			return fmt.Errorf("create bucket %q: %w", b, err)
		}
	}
	var handler http.Handler = gofakes3.New(mem).Server()
	if *verbose {
		inner := handler
		handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			logger.Info("request", "method", r.Method, "uri", r.URL.RequestURI())
			inner.ServeHTTP(w, r)
		})
	}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *addr, err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	if _, err := fmt.Fprintf(stdout, "listening on http://%s\n", ln.Addr()); err != nil {
		_ = srv.Close()
		return fmt.Errorf("write address: %w", err)
	}

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
