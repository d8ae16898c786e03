package main

/*
#include <stdint.h>
#include <stdlib.h>

// Defined in pybackup.c: calls a method of a Python backup object with the
// GIL held. op: 0 list, 1 upload, 2 download, 3 delete.
extern int mp_pybackup_call(void *obj, int op, char *a, char *b, char **out, size_t *out_len, char **err);
extern void mp_pybackup_release(void *obj);
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/backup/backupuri"
)

// pyBackup is a backup.Backup whose operations are methods of a Python
// object (list_keys, upload, download, delete), for stores the core does
// not speak. Calls take the GIL, so they run one at a time.
type pyBackup struct {
	obj  unsafe.Pointer
	desc string
}

func (p *pyBackup) call(op int, a, b string) (string, error) {
	ca, cb := C.CString(a), C.CString(b)
	defer C.free(unsafe.Pointer(ca))
	defer C.free(unsafe.Pointer(cb))
	var out, msg *C.char
	var n C.size_t
	if C.mp_pybackup_call(p.obj, C.int(op), ca, cb, &out, &n, &msg) != 0 {
		text := C.GoString(msg)
		C.free(unsafe.Pointer(msg))
		if strings.HasPrefix(text, "FileNotFoundError") || strings.HasPrefix(text, "KeyError") {
			return "", fmt.Errorf("%s: %w", text, backup.ErrNotFound)
		}
		return "", errors.New(text)
	}
	res := C.GoStringN(out, C.int(n))
	C.free(unsafe.Pointer(out))
	return res, nil
}

func (p *pyBackup) List(ctx context.Context, prefix string) ([]backup.ObjectInfo, error) {
	res, err := p.call(0, prefix, "")
	if err != nil {
		return nil, fmt.Errorf("list %q in %s: %w", prefix, p.desc, err)
	}
	var out []backup.ObjectInfo
	for _, line := range strings.Split(res, "\x00") {
		if line == "" {
			continue
		}
		key, size, _ := strings.Cut(line, "\t")
		n, _ := strconv.ParseInt(size, 10, 64)
		out = append(out, backup.ObjectInfo{Key: key, Size: n})
	}
	return out, nil
}

func (p *pyBackup) Upload(ctx context.Context, localPath, key string) error {
	if _, err := p.call(1, localPath, key); err != nil {
		return fmt.Errorf("upload %s to %s in %s: %w", localPath, key, p.desc, err)
	}
	return nil
}

func (p *pyBackup) Download(ctx context.Context, key, localPath string) error {
	if _, err := p.call(2, key, localPath); err != nil {
		return fmt.Errorf("download %s from %s: %w", key, p.desc, err)
	}
	return nil
}

func (p *pyBackup) Delete(ctx context.Context, key string) error {
	if _, err := p.call(3, key, ""); err != nil {
		return fmt.Errorf("delete %s from %s: %w", key, p.desc, err)
	}
	return nil
}

func (p *pyBackup) String() string { return p.desc }

// backupHandle is what a backup handle holds: the backend and, for Python
// objects, the reference to release.
type backupHandle struct {
	b  backup.Backup
	py *pyBackup
}

// liveGetenv reads the C environment as it is now. Go's os.Getenv sees a
// copy taken when the runtime started, so variables a Python program sets
// later (os.environ[...] = ...) would be invisible to it. Explicit values
// win over the environment.
func liveGetenv(explicit map[string]string) func(string) string {
	return func(name string) string {
		if v, ok := explicit[name]; ok && v != "" {
			return v
		}
		cname := C.CString(name)
		defer C.free(unsafe.Pointer(cname))
		if v := C.getenv(cname); v != nil {
			return C.GoString(v)
		}
		return ""
	}
}

// mp_backup_open opens the backup a URI names. Non-empty credentials
// override the AWS_* environment.
//
//export mp_backup_open
func mp_backup_open(uri, keyID, secret, token *C.char, out *C.uintptr_t, errKind *C.int, errMsg **C.char) C.int {
	getenv := liveGetenv(map[string]string{
		"AWS_ACCESS_KEY_ID": C.GoString(keyID), "AWS_SECRET_ACCESS_KEY": C.GoString(secret),
		"AWS_SESSION_TOKEN": C.GoString(token),
	})
	b, err := backupuri.Open(context.Background(), C.GoString(uri), backupuri.WithGetenv(getenv))
	if err != nil {
		return setErr(withKind(kindConfig, err), errKind, errMsg)
	}
	*out = C.uintptr_t(newHandle(&backupHandle{b: b}))
	return 0
}

// mp_backup_python wraps a Python object (a new reference the handle owns).
//
//export mp_backup_python
func mp_backup_python(obj unsafe.Pointer, desc *C.char, out *C.uintptr_t) {
	p := &pyBackup{obj: obj, desc: C.GoString(desc)}
	*out = C.uintptr_t(newHandle(&backupHandle{b: p, py: p}))
}

//export mp_backup_close
func mp_backup_close(h C.uintptr_t) {
	bh, err := lookup[*backupHandle](uintptr(h))
	if err != nil {
		return
	}
	deleteHandle(uintptr(h))
	if bh.py != nil {
		C.mp_pybackup_release(bh.py.obj)
	}
}

//export mp_backup_describe
func mp_backup_describe(h C.uintptr_t, out **C.char, errKind *C.int, errMsg **C.char) C.int {
	bh, err := lookup[*backupHandle](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	*out = C.CString(bh.b.String())
	return 0
}

// mp_backup_op runs one backup operation: 0 list (a = prefix; result is
// "key\tsize" entries separated by NUL), 1 upload (a = local path, b =
// key), 2 download (a = key, b = local path), 3 delete (a = key), 4 check.
//
//export mp_backup_op
func mp_backup_op(h C.uintptr_t, op C.int, a, b *C.char, out **C.char, outLen *C.size_t, errKind *C.int, errMsg **C.char) C.int {
	bh, err := lookup[*backupHandle](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	ctx := context.Background()
	sa, sb := C.GoString(a), C.GoString(b)
	switch op {
	case 0:
		objs, err := bh.b.List(ctx, sa)
		if err != nil {
			return setErr(withKind(kindBackup, err), errKind, errMsg)
		}
		var sbuf strings.Builder
		for _, o := range objs {
			fmt.Fprintf(&sbuf, "%s\t%d\x00", o.Key, o.Size)
		}
		res := sbuf.String()
		*out, *outLen = C.CString(res), C.size_t(len(res))
		return 0
	case 1:
		err = bh.b.Upload(ctx, sa, sb)
	case 2:
		err = bh.b.Download(ctx, sa, sb)
	case 3:
		err = bh.b.Delete(ctx, sa)
	case 4:
		if c, ok := bh.b.(backup.Checker); ok {
			err = c.Check(ctx)
		}
	default:
		err = fmt.Errorf("unknown backup operation %d", int(op))
	}
	return setErr(withKind(kindBackup, err), errKind, errMsg)
}
