package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCoreProcsLeavesACoreToPython(t *testing.T) {
	for cpus, want := range map[int]int{1: 1, 2: 1, 4: 3, 16: 15} {
		assert.Equal(t, want, coreProcs(cpus), "%d cpus", cpus)
	}
}
