// Package faultbackup wraps a [backup.Backup] to inject failures in tests:
// fail the Nth call, every Nth call, or every call from the Nth on, of some
// operations, optionally only for keys under a prefix, optionally after the
// call has actually been made ("the upload succeeded but the caller was told
// it failed"). It counts calls per operation.
//
// The in-memory calls of [backup.Small] count as the operations they stand
// for, so rules written for files also hit records: Get is an OpDownload,
// Put an OpUpload, and Create an OpUpload that is also an OpCreate (a rule
// on OpCreate hits only conditional creates).
//
//	fb := faultbackup.New(dir)
//	fb.AddRule(faultbackup.Nth(faultbackup.OpUpload, 3, nil)) // 3rd upload fails
//	fb.AddRule(faultbackup.FromNth(faultbackup.OpDelete, 1, errDisk).WithKeyPrefix("gc/"))
package faultbackup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/millpond/millpond/gostore/backup"
)

// ErrInjected is the error returned by a rule whose Err is nil.
var ErrInjected = errors.New("injected fault")

// Op is a set of backup operations.
type Op uint8

// The operations of [backup.Backup]; combine them with |.
const (
	OpList Op = 1 << iota
	OpUpload
	OpDownload
	OpDelete
	OpCreate

	OpAll = OpList | OpUpload | OpDownload | OpDelete | OpCreate
)

// String names the operations in the set, e.g. "upload|delete".
func (o Op) String() string {
	var names []string
	for _, n := range []struct {
		op   Op
		name string
	}{{OpList, "list"}, {OpUpload, "upload"}, {OpDownload, "download"}, {OpDelete, "delete"}, {OpCreate, "create"}} {
		if o&n.op != 0 {
			names = append(names, n.name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "|")
}

// Rule decides which calls fail. A rule counts the calls it matches (calls
// of one of its operations whose key, or listing prefix, starts with
// KeyPrefix), numbering them from 1; call number n fails when n >= Start,
// (n - Start) is a multiple of Every, and the rule has failed fewer than
// Times calls so far.
//
// Build rules with [Nth], [EveryNth] and [FromNth], and refine them with the
// With methods.
type Rule struct {
	// Op is the set of operations the rule applies to.
	Op Op
	// KeyPrefix restricts the rule to keys (or list prefixes) starting with
	// it. Empty matches every call.
	KeyPrefix string
	// Start is the number of the first failing call (1-based).
	Start int
	// Every is the period of failures from Start on; 0 means only Start.
	Every int
	// Times caps the number of failures; 0 means no cap.
	Times int
	// Err is returned by a failing call, wrapped with the operation and key;
	// nil means ErrInjected.
	Err error
	// CallThrough makes the wrapped backend perform the call before the
	// failure is reported, so its effect is kept (an upload that succeeded
	// but whose acknowledgement was lost).
	CallThrough bool
}

// Nth fails only the nth matching call of op.
func Nth(op Op, n int, err error) Rule { return Rule{Op: op, Start: n, Times: 1, Err: err} }

// EveryNth fails matching calls n, 2n, 3n... of op.
func EveryNth(op Op, n int, err error) Rule { return Rule{Op: op, Start: n, Every: n, Err: err} }

// FromNth fails every matching call of op from the nth on.
func FromNth(op Op, n int, err error) Rule { return Rule{Op: op, Start: n, Every: 1, Err: err} }

// WithKeyPrefix returns r restricted to keys starting with prefix.
func (r Rule) WithKeyPrefix(prefix string) Rule { r.KeyPrefix = prefix; return r }

// WithTimes returns r failing at most n calls.
func (r Rule) WithTimes(n int) Rule { r.Times = n; return r }

// WithCallThrough returns r performing the call before reporting failure.
func (r Rule) WithCallThrough() Rule { r.CallThrough = true; return r }

// ruleState is a rule with its counters.
type ruleState struct {
	Rule
	seen, fired int
}

// FaultBackup wraps a [backup.Backup] and fails calls according to its
// rules. It is safe for concurrent use; rules can change while calls run.
type FaultBackup struct {
	inner backup.Backup

	mu       sync.Mutex
	rules    []*ruleState
	calls    map[Op]int
	failures map[Op]int
}

var (
	_ backup.Backup  = (*FaultBackup)(nil)
	_ backup.Checker = (*FaultBackup)(nil)
	_ backup.Small   = (*FaultBackup)(nil)
)

// New wraps inner with no rules: every call passes through.
func New(inner backup.Backup, rules ...Rule) *FaultBackup {
	fb := &FaultBackup{inner: inner, calls: map[Op]int{}, failures: map[Op]int{}}
	for _, r := range rules {
		fb.AddRule(r)
	}
	return fb
}

// Inner returns the wrapped backend.
func (fb *FaultBackup) Inner() backup.Backup { return fb.inner }

// AddRule adds a rule; its call count starts at zero now.
func (fb *FaultBackup) AddRule(r Rule) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fb.rules = append(fb.rules, &ruleState{Rule: r})
}

// ClearRules removes every rule; counters of calls are kept.
func (fb *FaultBackup) ClearRules() {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fb.rules = nil
}

// Calls returns the number of calls made so far of the operations in op,
// failed or not.
func (fb *FaultBackup) Calls(op Op) int { return fb.sum(fb.calls, op) }

// Failures returns the number of injected failures so far of the
// operations in op.
func (fb *FaultBackup) Failures(op Op) int { return fb.sum(fb.failures, op) }

func (fb *FaultBackup) sum(m map[Op]int, op Op) int {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	n := 0
	for o, c := range m {
		if o&op != 0 {
			n += c
		}
	}
	return n
}

// decide counts a call and returns the rule that fails it, if any. Every
// matching rule counts the call; the first one that fires wins.
func (fb *FaultBackup) decide(op Op, key string) *Rule {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fb.calls[op]++
	var hit *Rule
	for _, r := range fb.rules {
		if r.Op&op == 0 || !strings.HasPrefix(key, r.KeyPrefix) {
			continue
		}
		r.seen++
		if hit != nil || r.Start <= 0 || r.seen < r.Start || (r.Times > 0 && r.fired >= r.Times) {
			continue
		}
		if d := r.seen - r.Start; d != 0 && (r.Every <= 0 || d%r.Every != 0) {
			continue
		}
		r.fired++
		fb.failures[op]++
		rule := r.Rule
		hit = &rule
	}
	return hit
}

// do runs call unless a rule fails it first.
func (fb *FaultBackup) do(op Op, key string, call func() error) error {
	return fb.doNamed(op, op.String(), key, call)
}

// doNamed is do with the name of the call for the error message, for calls
// that count as more than one operation.
func (fb *FaultBackup) doNamed(op Op, name, key string, call func() error) error {
	r := fb.decide(op, key)
	if r == nil {
		return call()
	}
	if r.CallThrough {
		if err := call(); err != nil {
			return err
		}
	}
	err := r.Err
	if err == nil {
		err = ErrInjected
	}
	return fmt.Errorf("%s %s in %s: %w", name, key, fb, err)
}

// List lists through the wrapped backend unless a rule fails it.
func (fb *FaultBackup) List(ctx context.Context, prefix string) ([]backup.ObjectInfo, error) {
	var out []backup.ObjectInfo
	err := fb.do(OpList, prefix, func() (err error) {
		out, err = fb.inner.List(ctx, prefix)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Upload uploads through the wrapped backend unless a rule fails it.
func (fb *FaultBackup) Upload(ctx context.Context, localPath, key string) error {
	return fb.do(OpUpload, key, func() error { return fb.inner.Upload(ctx, localPath, key) })
}

// Download downloads through the wrapped backend unless a rule fails it.
func (fb *FaultBackup) Download(ctx context.Context, key, localPath string) error {
	return fb.do(OpDownload, key, func() error { return fb.inner.Download(ctx, key, localPath) })
}

// Delete deletes through the wrapped backend unless a rule fails it.
func (fb *FaultBackup) Delete(ctx context.Context, key string) error {
	return fb.do(OpDelete, key, func() error { return fb.inner.Delete(ctx, key) })
}

// String describes the wrapped backend, marked as fault-injecting.
func (fb *FaultBackup) String() string { return "faulty " + fb.inner.String() }

// Check delegates to the wrapped backend if it is a [backup.Checker]; it is
// never failed by rules.
func (fb *FaultBackup) Check(ctx context.Context) error {
	if c, ok := fb.inner.(backup.Checker); ok {
		return c.Check(ctx)
	}
	return nil
}

// small returns the wrapped backend as a [backup.Small], or an error
// wrapping errors.ErrUnsupported naming the call.
func (fb *FaultBackup) small(call, key string) (backup.Small, error) {
	sb, ok := fb.inner.(backup.Small)
	if !ok {
		return nil, fmt.Errorf("%s %s in %s: the wrapped store keeps no small objects in memory: %w",
			call, key, fb, errors.ErrUnsupported)
	}
	return sb, nil
}

// Get gets through the wrapped backend unless a rule on OpDownload fails
// it. A wrapped backend that is not a [backup.Small] gives an error
// wrapping errors.ErrUnsupported.
func (fb *FaultBackup) Get(ctx context.Context, key string) ([]byte, error) {
	sb, err := fb.small("get", key)
	if err != nil {
		return nil, err
	}
	var out []byte
	err = fb.doNamed(OpDownload, "get", key, func() (err error) {
		out, err = sb.Get(ctx, key)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Put puts through the wrapped backend unless a rule on OpUpload fails it.
func (fb *FaultBackup) Put(ctx context.Context, key string, data []byte) error {
	sb, err := fb.small("put", key)
	if err != nil {
		return err
	}
	return fb.doNamed(OpUpload, "put", key, func() error { return sb.Put(ctx, key, data) })
}

// Create creates through the wrapped backend unless a rule on OpUpload or
// OpCreate fails it. With CallThrough the object is created and the
// failure reported anyway, as a conditional write whose answer was lost.
func (fb *FaultBackup) Create(ctx context.Context, key string, data []byte) error {
	sb, err := fb.small("create", key)
	if err != nil {
		return err
	}
	return fb.doNamed(OpUpload|OpCreate, "create", key, func() error { return sb.Create(ctx, key, data) })
}
