package faultbackup

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/backup/backuptest"
	"github.com/millpond/millpond/gostore/backup/dirbackup"
)

func newDir(t *testing.T) *dirbackup.DirBackup {
	t.Helper()
	b, err := dirbackup.New(filepath.Join(t.TempDir(), "store"), nil)
	require.NoError(t, err)
	return b
}

func TestConformanceWithoutRules(t *testing.T) {
	backuptest.RunConformance(t, func(t *testing.T) backup.Backup { return New(newDir(t)) })
}

// failedUploads uploads keys k1..kn and returns the numbers that failed.
func failedUploads(t *testing.T, fb *FaultBackup, n int, keyPrefix string) []int {
	t.Helper()
	src, _ := backuptest.WriteRandomFile(t, t.TempDir(), 3)
	var failed []int
	for i := 1; i <= n; i++ {
		if err := fb.Upload(context.Background(), src, fmt.Sprintf("%sk%d", keyPrefix, i)); err != nil {
			failed = append(failed, i)
		}
	}
	return failed
}

func TestRulesSelectFailingCalls(t *testing.T) {
	tests := []struct {
		name string
		rule Rule
		want []int
	}{
		{"Nth", Nth(OpUpload, 3, nil), []int{3}},
		{"EveryNth", EveryNth(OpUpload, 3, nil), []int{3, 6, 9}},
		{"FromNth", FromNth(OpUpload, 8, nil), []int{8, 9, 10}},
		{"FromNthTimes", FromNth(OpUpload, 2, nil).WithTimes(3), []int{2, 3, 4}},
		{"EveryOtherFromFour", Rule{Op: OpUpload, Start: 4, Every: 2}, []int{4, 6, 8, 10}},
		{"OtherOperation", FromNth(OpDelete, 1, nil), nil},
		{"AnyOperation", Nth(OpAll, 2, nil), []int{2}},
		{"ZeroStartNeverFires", Rule{Op: OpUpload}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := New(newDir(t), tt.rule)
			assert.Equal(t, tt.want, failedUploads(t, fb, 10, ""))
			assert.Equal(t, 10, fb.Calls(OpUpload))
			assert.Equal(t, len(tt.want), fb.Failures(OpAll))
		})
	}
}

func TestFailedCallHasNoEffectAndWrapsErr(t *testing.T) {
	errDisk := errors.New("disk on fire")
	fb := New(newDir(t), Nth(OpUpload, 1, errDisk))
	src, _ := backuptest.WriteRandomFile(t, t.TempDir(), 3)
	err := fb.Upload(context.Background(), src, "seg/1")
	require.ErrorIs(t, err, errDisk)
	assert.Contains(t, err.Error(), "upload seg/1")
	assert.Empty(t, backuptest.Keys(t, fb, ""))
	require.NoError(t, fb.Upload(context.Background(), src, "seg/1"))
	assert.Equal(t, []string{"seg/1"}, backuptest.Keys(t, fb, ""))
}

func TestDefaultErrorIsErrInjected(t *testing.T) {
	fb := New(newDir(t), Nth(OpList, 1, nil))
	_, err := fb.List(context.Background(), "")
	assert.ErrorIs(t, err, ErrInjected)
}

func TestCallThroughKeepsEffectButReportsFailure(t *testing.T) {
	fb := New(newDir(t), Nth(OpUpload, 1, nil).WithCallThrough(), Nth(OpDelete, 1, nil).WithCallThrough())
	src, _ := backuptest.WriteRandomFile(t, t.TempDir(), 3)
	require.ErrorIs(t, fb.Upload(context.Background(), src, "commit/5"), ErrInjected)
	assert.Equal(t, []string{"commit/5"}, backuptest.Keys(t, fb.Inner(), ""), "the upload happened")
	require.ErrorIs(t, fb.Delete(context.Background(), "commit/5"), ErrInjected)
	assert.Empty(t, backuptest.Keys(t, fb.Inner(), ""), "the delete happened")
}

func TestKeyPrefixRestrictsAndCountsOnlyMatchingCalls(t *testing.T) {
	fb := New(newDir(t), Nth(OpUpload, 2, nil).WithKeyPrefix("commits/"))
	assert.Empty(t, failedUploads(t, fb, 5, "segments/"))
	assert.Equal(t, []int{2}, failedUploads(t, fb, 3, "commits/"))
	assert.Equal(t, 8, fb.Calls(OpUpload))
}

func TestDownloadAndListFaults(t *testing.T) {
	fb := New(newDir(t))
	backuptest.Put(t, fb, "a", []byte("x"))
	fb.AddRule(EveryNth(OpDownload|OpList, 2, nil))
	dst := filepath.Join(t.TempDir(), "d")
	assert.NoError(t, fb.Download(context.Background(), "a", dst)) // download #1
	assert.Error(t, fb.Download(context.Background(), "a", dst))   // download #2
	_, err := fb.List(context.Background(), "")                    // list #1 (rule counts 3)
	assert.NoError(t, err)
	_, err = fb.List(context.Background(), "") // list #2 (rule counts 4)
	assert.Error(t, err)
	assert.Equal(t, 2, fb.Failures(OpDownload|OpList))
	assert.Equal(t, 1, fb.Failures(OpList))
	fb.ClearRules()
	_, err = fb.List(context.Background(), "")
	assert.NoError(t, err)
	assert.Equal(t, 3, fb.Calls(OpList))
}

func TestConcurrentCallsCountExactly(t *testing.T) {
	fb := New(newDir(t), EveryNth(OpDelete, 10, nil))
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = fb.Delete(context.Background(), fmt.Sprintf("k%d", i))
		}()
	}
	wg.Wait()
	assert.Equal(t, 100, fb.Calls(OpDelete))
	assert.Equal(t, 10, fb.Failures(OpDelete))
}

func TestOpString(t *testing.T) {
	assert.Equal(t, "upload|delete", (OpUpload | OpDelete).String())
	assert.Equal(t, "list|upload|download|delete|create", OpAll.String())
	assert.Equal(t, "none", Op(0).String())
}

func TestStringMarksWrapper(t *testing.T) {
	inner := newDir(t)
	assert.Equal(t, "faulty "+inner.String(), New(inner).String())
}
