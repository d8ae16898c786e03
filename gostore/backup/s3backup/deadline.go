package s3backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
)

// An endpoint that accepts connections and never answers must not hang a
// call: every HTTP attempt runs under a deadline. A small request (list,
// get, put, create, delete, check) has Timeout for the whole attempt, body
// included. A large transfer (an upload's parts, a download's body) has no
// fixed total, which would fail a big file on a slow link, but fails when
// no byte has moved for StallTimeout. The SDK retries a timed-out attempt
// like a dropped connection, within MaxAttempts.

// timeoutError is the cause of an attempt cut short by its deadline. It is
// a net.Error whose Timeout is true, so the SDK retries it.
type timeoutError struct {
	after time.Duration
	stall bool
}

func (e *timeoutError) Error() string {
	if e.stall {
		return fmt.Sprintf("no data moved for %s", e.after)
	}
	return fmt.Sprintf("no answer within %s", e.after)
}
func (e *timeoutError) Timeout() bool   { return true }
func (e *timeoutError) Temporary() bool { return true }

var _ net.Error = (*timeoutError)(nil)

// callKey marks the context of one backend call; see callInfo.
type callKey struct{}

// callInfo travels in the context of one call of the backend: whether it
// is a large transfer, and how many HTTP attempts it has made (for the
// error message of a call that timed out).
type callInfo struct {
	transfer bool
	attempts atomic.Int32
}

func infoOf(ctx context.Context) *callInfo {
	ci, _ := ctx.Value(callKey{}).(*callInfo)
	return ci
}

// httpDoer is the SDK's HTTP client interface.
type httpDoer interface {
	Do(*http.Request) (*http.Response, error)
}

// deadlineClient puts the deadlines described above on every request it
// sends through base. It wraps the client the SDK configured (rather than
// a transport under it) so that the SDK's own setup of that client, such as
// the CA bundle of AWS_CA_BUNDLE, still applies.
type deadlineClient struct {
	base    httpDoer
	timeout time.Duration
	stall   time.Duration
}

// newHTTPClient returns the SDK's buildable HTTP client with bounded dial,
// TLS handshake and wait for response headers.
func newHTTPClient(timeout time.Duration) *awshttp.BuildableClient {
	return awshttp.NewBuildableClient().
		WithDialerOptions(func(d *net.Dialer) { d.Timeout = timeout }).
		WithTransportOptions(func(t *http.Transport) {
			t.TLSHandshakeTimeout = timeout
			t.ResponseHeaderTimeout = timeout
		})
}

// Do sends req under its attempt's deadline.
func (t *deadlineClient) Do(req *http.Request) (*http.Response, error) {
	ci := infoOf(req.Context())
	transfer := ci != nil && ci.transfer
	if ci != nil {
		ci.attempts.Add(1)
	}
	ctx, cancel := context.WithCancelCause(req.Context())
	cause := &timeoutError{after: t.timeout}
	if transfer {
		cause = &timeoutError{after: t.stall, stall: true}
	}
	timer := time.AfterFunc(cause.after, func() { cancel(cause) })
	progress := func() {}
	if transfer {
		progress = func() { timer.Reset(cause.after) }
	}
	stop := func() {
		timer.Stop()
		cancel(nil)
	}
	// The clone shares the body; only its context differs.
	req = req.WithContext(ctx)
	if transfer && req.Body != nil && req.Body != http.NoBody && req.ContentLength > 0 {
		// Only a body of known length is wrapped: the transport sends one
		// of unknown length chunked, which S3 refuses.
		req.Body = &watchedBody{rc: req.Body, progress: progress, ctx: ctx}
	}
	resp, err := t.base.Do(req)
	if err != nil {
		stop()
		return nil, ours(ctx, err)
	}
	resp.Body = &watchedBody{rc: resp.Body, progress: progress, ctx: ctx, stop: stop}
	return resp, nil
}

// ours returns the deadline's timeoutError for err if the deadline is what
// ended the attempt, err otherwise.
func ours(ctx context.Context, err error) error {
	// The transport's own error would be "context canceled", which reads
	// as the caller's cancellation; the deadline's error says what
	// happened.
	var te *timeoutError
	if errors.As(context.Cause(ctx), &te) {
		return te
	}
	return err
}

// watchedBody reports progress on reads and, for a response, ends the
// attempt's deadline when closed.
type watchedBody struct {
	rc       io.ReadCloser
	progress func()
	ctx      context.Context
	stop     func()
}

func (w *watchedBody) Read(p []byte) (int, error) {
	n, err := w.rc.Read(p)
	if n > 0 {
		w.progress()
	}
	if err != nil && err != io.EOF {
		err = ours(w.ctx, err)
	}
	return n, err
}

func (w *watchedBody) Close() error {
	err := w.rc.Close()
	if w.stop != nil {
		w.stop()
	}
	return err
}

// begin starts one call of the backend. The returned context carries the
// call's callInfo and, unless total is 0, a deadline on the whole call (a
// net under the per-attempt deadlines, which bound it already). done
// releases the context.
func (b *S3Backup) begin(ctx context.Context, transfer bool, total time.Duration) (context.Context, *callInfo, context.CancelFunc) {
	ci := &callInfo{transfer: transfer}
	ctx = context.WithValue(ctx, callKey{}, ci)
	if total <= 0 {
		ctx, cancel := context.WithCancel(ctx)
		return ctx, ci, cancel
	}
	ctx, cancel := context.WithTimeoutCause(ctx, total, &timeoutError{after: b.timeout})
	return ctx, ci, cancel
}

// smallDeadline is the longest a small call can take: every attempt runs
// out its Timeout and every backoff is the longest the SDK would sleep
// (doubling from 1 s, capped at MaxBackoff), plus a second of slack.
func (b *S3Backup) smallDeadline() time.Duration {
	total := time.Duration(b.attempts)*b.timeout + time.Second
	for i := 1; i < b.attempts; i++ {
		total += min(b.backoff, time.Second<<min(i, 20))
	}
	return total
}

// explainCall is explain for one call begun with begin (parent is the
// caller's context, ctx the call's): the caller's cancellation is returned
// as is, a call that ran out of time says so, naming the store (when
// whole) or the endpoint, the deadline, the attempts made and what to
// check.
func (b *S3Backup) explainCall(parent, ctx context.Context, ci *callInfo, err error, whole bool) error {
	if err == nil || parent.Err() != nil {
		return err
	}
	var te *timeoutError
	var netErr net.Error
	timedOut := errors.As(err, &te) || errors.As(context.Cause(ctx), &te) ||
		(errors.As(err, &netErr) && netErr.Timeout())
	if !timedOut {
		return b.explain(err)
	}
	b.logger.Debug("s3 request timed out", "store", b.String(), "err", b.mask(err.Error()))
	subject := "endpoint " + b.endpointName()
	if whole {
		subject = b.storeURL() + " (endpoint " + b.endpointName() + ")"
	}
	attempts := "1 attempt"
	if n := ci.attempts.Load(); n != 1 {
		attempts = fmt.Sprintf("%d attempts", n)
	}
	if te != nil && te.stall {
		return &explainedError{err: err, msg: b.mask(fmt.Sprintf("%s stalled: no data moved for %s (%s); check that the "+
			"endpoint is up and reachable and the link not saturated, or raise stall_timeout= in the backup URI",
			subject, b.stall, attempts))}
	}
	return &explainedError{err: err, msg: b.mask(fmt.Sprintf("%s did not answer within %s (%s); check that the endpoint "+
		"is up and reachable, or raise timeout= in the backup URI", subject, b.timeout, attempts))}
}
