// Package main is the C ABI over the Go core, loaded by CPython as the
// extension module millpond._core.
//
// It is the only package that knows about C or Python. The CPython module
// itself (method table, argument parsing, packing Python objects into
// buffers and unpacking results) is hand-written C in module.c; the Go side
// exports functions that take and return plain C values. Go code here never
// touches a PyObject: the C side releases the GIL around every call into Go
// and holds it while it builds Python objects.
//
// Go objects cross the boundary as runtime/cgo handles. Errors cross as a
// kind code (see errors.go) and a malloc'd message the C side frees.
package main

/*
#cgo LDFLAGS: -Wl,--unresolved-symbols=ignore-all
*/
import "C"

func main() {}
