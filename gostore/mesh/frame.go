package mesh

// Frame is a data frame (kind 0) received from a peer.
type Frame struct {
	From    int    // the sending process's index
	Payload []byte // the bytes given to its Send; owned by the receiver
}

// outFrame is a frame waiting in an outbound queue.
type outFrame struct {
	kind    byte
	payload []byte
}
