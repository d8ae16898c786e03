package mesh

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Every error of the package matches ErrMesh, and still its own sentinel
// (and no other), however it is wrapped.
func TestEveryMeshErrorMatchesErrMesh(t *testing.T) {
	sentinels := []error{
		ErrConfig, ErrClosed, ErrPeerLost, ErrPeerLeft, ErrAuthentication, ErrTLSMismatch, ErrIdentityMismatch,
		ErrForeignProtocol, ErrRefused, ErrProtocol, ErrAborted, ErrNotJoined,
	}
	cases := map[string]func(error) error{
		"bare":       func(s error) error { return s },
		"fmt %w":     func(s error) error { return fmt.Errorf("send to process 1: %w", s) },
		"kind error": func(s error) error { return errorf(s, errors.New("cause"), "process 1 failed") },
	}
	for name, wrap := range cases {
		for i, s := range sentinels {
			err := wrap(s)
			assert.ErrorIs(t, err, ErrMesh, "%s %v", name, s)
			for j, other := range sentinels {
				assert.Equal(t, i == j, errors.Is(err, other), "%s %v is %v", name, s, other)
			}
		}
	}
	lost := fmt.Errorf("x: %w", &PeerLostError{Peer: 1, Address: "127.0.0.1:1", Reason: "silent"})
	assert.ErrorIs(t, lost, ErrMesh)
	assert.ErrorIs(t, lost, ErrPeerLost)
	assert.NotErrorIs(t, errors.New("a disk error"), ErrMesh)
}
