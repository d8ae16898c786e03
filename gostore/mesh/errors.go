package mesh

import (
	"errors"
	"fmt"
)

// ErrMesh is matched (errors.Is) by every error of this package: each
// sentinel below and *PeerLostError. A caller that only needs to know that
// the cluster failed asks for this one.
var ErrMesh = errors.New("the cluster mesh failed")

// sentinel is the type of this package's sentinels: matched by identity,
// and each also matches ErrMesh.
type sentinel struct{ msg string }

func (s *sentinel) Error() string { return s.msg }

// Is reports whether target is ErrMesh.
func (s *sentinel) Is(target error) bool { return target == ErrMesh }

func newSentinel(msg string) error { return &sentinel{msg: msg} }

// Sentinels that errors.Is recognises in the errors of Start, Send and Err.
var (
	// ErrConfig is wrapped by every validation error of Start.
	ErrConfig = newSentinel("invalid cluster configuration")
	// ErrClosed is wrapped by Send after Close.
	ErrClosed = newSentinel("the cluster mesh is closed")
	// ErrPeerLost matches every *PeerLostError.
	ErrPeerLost = newSentinel("a process of the cluster was lost")
	// ErrPeerLeft is wrapped by Send to a process that said goodbye (closed
	// its mesh).
	ErrPeerLeft = newSentinel("the process left the cluster")
	// ErrAuthentication is wrapped when a process could not prove that it
	// knows the cluster secret, or failed TLS authentication (a
	// certificate not signed by the CA, or not valid for its host).
	ErrAuthentication = newSentinel("cluster authentication failed")
	// ErrTLSMismatch is wrapped when one process uses TLS and its peer
	// does not.
	ErrTLSMismatch = newSentinel("TLS on one side only")
	// ErrIdentityMismatch is wrapped when two processes disagree on their
	// Identity, their index or the number of processes.
	ErrIdentityMismatch = newSentinel("the processes disagree")
	// ErrForeignProtocol is wrapped when something other than a millpond
	// process answers on a peer's address.
	ErrForeignProtocol = newSentinel("not a millpond cluster process")
	// ErrRefused is wrapped when a peer refused the connection for a reason
	// it sent (for example another protocol version).
	ErrRefused = newSentinel("the connection was refused")
	// ErrProtocol is wrapped when a peer sent something the protocol does
	// not allow, such as a control kind this process has no handler for.
	ErrProtocol = newSentinel("cluster protocol violation")
	// ErrAborted is wrapped by Err after Abort.
	ErrAborted = newSentinel("this process aborted")
	// ErrNotJoined is wrapped when peers did not connect within StartTimeout.
	ErrNotJoined = newSentinel("processes did not join in time")
)

// PeerLostError is the failure of a running mesh whose peer broke its
// stream or stayed silent for PeerTimeout. errors.Is(err, ErrPeerLost)
// holds for it.
type PeerLostError struct {
	Peer    int    // the lost process's index
	Address string // its address
	Reason  string // what was seen: a broken connection, a silence
}

// Error returns "process 2 (10.0.0.7:2101) lost: <reason>".
func (e *PeerLostError) Error() string {
	return fmt.Sprintf("process %d (%s) lost: %s", e.Peer, e.Address, e.Reason)
}

// Is reports whether target is ErrPeerLost or ErrMesh.
func (e *PeerLostError) Is(target error) bool { return target == ErrPeerLost || target == ErrMesh }

// kindError is an error with an exact message that errors.Is matches
// against a sentinel (and, if set, the underlying cause).
type kindError struct {
	msg   string
	kind  error
	cause error
}

func (e *kindError) Error() string { return e.msg }

func (e *kindError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.kind}
	}
	return []error{e.kind, e.cause}
}

// errorf builds a kindError with a formatted message.
func errorf(kind, cause error, format string, args ...any) error {
	return &kindError{msg: fmt.Sprintf(format, args...), kind: kind, cause: cause}
}
