package durable

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUnlinkedFileNeverHasAName: the temporary file a small download goes
// through leaves no entry in the temporary directory at any moment, so a
// process killed while it is open leaves nothing behind; its path still
// reaches the data.
func TestUnlinkedFileNeverHasAName(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	f, path, err := unlinkedFile([]byte("record"))
	require.NoError(t, err)
	defer f.Close()
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, entries, "the temporary directory holds a named file")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "record", string(data))
	require.NoError(t, os.WriteFile(path, []byte("downloaded"), 0o600))
	data, err = os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "downloaded", string(data))
}
