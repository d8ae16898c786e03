package main

import (
	"os"
	"runtime"
)

// The Go core works beside a Python flow that keeps one core busy by itself
// (the GIL makes the flow's threads share one). Left at one thread per
// core, the core's background work (segments, uploads, local store files)
// ran on both cores of a two-core machine at once, taking turns with the
// flow on its own core: a word count with recovery on ran 0.74-1.0x of its
// speed without, and 0.89-1.19x with the core held to the other core.
// GOMAXPROCS in the environment, when set, is left as the user chose.
func init() {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	runtime.GOMAXPROCS(coreProcs(runtime.NumCPU()))
}

// coreProcs is how many threads run Go code at once on a machine with
// cpus cores: all but the one the Python flow needs.
func coreProcs(cpus int) int {
	return max(1, cpus-1)
}
