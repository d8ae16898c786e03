package mesh

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// codecName is the content-subtype of mesh streams
// ("application/grpc+millpond-mesh").
const codecName = "millpond-mesh"

// rawCodec moves *msg values as raw bytes: a one- or two-byte header and
// the body, without protobuf and without copying the body on send. It is
// handed to gRPC per client and server (ForceCodecV2,
// ForceServerCodecV2), never registered globally.
type rawCodec struct{}

var _ encoding.CodecV2 = rawCodec{}

// Name returns the codec's content-subtype.
func (rawCodec) Name() string { return codecName }

// Marshal returns the message's header and its body as two buffers. The
// body is not copied: it must not change until the stream is done with it,
// which holds because Send copies payloads and nothing writes them after.
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*msg)
	if !ok {
		return nil, fmt.Errorf("mesh codec: cannot marshal %T", v)
	}
	head := mem.SliceBuffer(m.header())
	if len(m.body) == 0 {
		return mem.BufferSlice{head}, nil
	}
	return mem.BufferSlice{head, mem.SliceBuffer(m.body)}, nil
}

// Unmarshal copies the received bytes once (gRPC reuses its buffers) and
// points the message's body into the copy.
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*msg)
	if !ok {
		return fmt.Errorf("mesh codec: cannot unmarshal into %T", v)
	}
	return m.decode(data.Materialize())
}

// msgType is the first byte of every message on a mesh stream.
type msgType byte

// The messages of a stream. A stream from process i to process j carries,
// from i: hello, proof, then frames and at last goodbye; from j: challenge,
// accept (or refuse), then heartbeats and at last goodbye. Either side may
// end it with an abort instead of a goodbye: it failed, and says why.
const (
	msgFrame     msgType = 1 // kind byte, payload
	msgHeartbeat msgType = 2 // empty
	msgGoodbye   msgType = 3 // empty
	msgHello     msgType = 4 // see hello
	msgChallenge msgType = 5 // see challenge
	msgProof     msgType = 6 // the client's MAC
	msgAccept    msgType = 7 // empty
	msgRefuse    msgType = 8 // see refusal
	msgAbort     msgType = 9 // why the sender stopped (either direction)
)

// msg is one message of a mesh stream.
type msg struct {
	typ  msgType
	kind byte   // msgFrame only: 0 data, 1..255 control
	body []byte // a frame's payload or an encoded handshake message
}

var errEmptyMessage = errors.New("empty message")

func (m *msg) header() []byte {
	if m.typ == msgFrame {
		return []byte{byte(m.typ), m.kind}
	}
	return []byte{byte(m.typ)}
}

func (m *msg) decode(b []byte) error {
	if len(b) == 0 {
		return errEmptyMessage
	}
	m.typ = msgType(b[0])
	m.kind = 0
	if m.typ == msgFrame {
		if len(b) < 2 {
			return errors.New("frame without a kind byte")
		}
		m.kind = b[1]
		m.body = b[2:]
		return nil
	}
	m.body = b[1:]
	return nil
}
