package main

/*
#include <stdint.h>
#include <stdlib.h>
#include "gocalls.h"
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
// not speak. Calls take the GIL (pybackup.c), so they run one at a time.
type pyBackup struct {
	obj  unsafe.Pointer
	desc string
}

func (p *pyBackup) call(op C.int, a, b string) (string, error) {
	ca, cb := C.CString(a), C.CString(b)
	defer C.free(unsafe.Pointer(ca))
	defer C.free(unsafe.Pointer(cb))
	var out, msg *C.char
	var n C.size_t
	var notFound C.int
	if C.mp_pybackup_call(p.obj, op, ca, cb, &out, &n, &msg, &notFound) != 0 {
		text := C.GoString(msg)
		C.free(unsafe.Pointer(msg))
		if notFound != 0 {
			return "", fmt.Errorf("%s: %w", text, backup.ErrNotFound)
		}
		return "", errors.New(text)
	}
	res := C.GoStringN(out, C.int(n))
	C.free(unsafe.Pointer(out))
	return res, nil
}

func (p *pyBackup) List(ctx context.Context, prefix string) ([]backup.ObjectInfo, error) {
	res, err := p.call(C.MP_BACKUP_LIST, prefix, "")
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
	if _, err := p.call(C.MP_BACKUP_UPLOAD, localPath, key); err != nil {
		return fmt.Errorf("upload %s to %s in %s: %w", localPath, key, p.desc, err)
	}
	return nil
}

func (p *pyBackup) Download(ctx context.Context, key, localPath string) error {
	if _, err := p.call(C.MP_BACKUP_DOWNLOAD, key, localPath); err != nil {
		return fmt.Errorf("download %s from %s: %w", key, p.desc, err)
	}
	return nil
}

func (p *pyBackup) Delete(ctx context.Context, key string) error {
	if _, err := p.call(C.MP_BACKUP_DELETE, key, ""); err != nil {
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
	b, err := backupuri.Open(callCtx(), C.GoString(uri),
		backupuri.WithGetenv(getenv), backupuri.WithLogger(bridge.logger()))
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

// mp_backup_list returns "key\tsize" entries, each NUL-terminated.
//
//export mp_backup_list
func mp_backup_list(h C.uintptr_t, prefix *C.char, out **C.char, outLen *C.size_t, errKind *C.int, errMsg **C.char) C.int {
	bh, err := lookup[*backupHandle](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	objs, err := bh.b.List(callCtx(), C.GoString(prefix))
	if err != nil {
		return setErr(withKind(kindBackup, err), errKind, errMsg)
	}
	var sb strings.Builder
	for _, o := range objs {
		fmt.Fprintf(&sb, "%s\t%d\x00", o.Key, o.Size)
	}
	res := sb.String()
	*out, *outLen = C.CString(res), C.size_t(len(res))
	return 0
}

//export mp_backup_upload
func mp_backup_upload(h C.uintptr_t, path, key *C.char, errKind *C.int, errMsg **C.char) C.int {
	return backupOp(h, errKind, errMsg, func(b backup.Backup) error {
		return b.Upload(callCtx(), C.GoString(path), C.GoString(key))
	})
}

// mp_backup_download reports a missing key as kind not_found, which the
// Python side raises as FileNotFoundError (the Backup protocol's way).
//
//export mp_backup_download
func mp_backup_download(h C.uintptr_t, key, path *C.char, errKind *C.int, errMsg **C.char) C.int {
	return backupOp(h, errKind, errMsg, func(b backup.Backup) error {
		err := b.Download(callCtx(), C.GoString(key), C.GoString(path))
		if errors.Is(err, backup.ErrNotFound) {
			return kinded{kind: kindNotFound, err: err}
		}
		return err
	})
}

//export mp_backup_delete
func mp_backup_delete(h C.uintptr_t, key *C.char, errKind *C.int, errMsg **C.char) C.int {
	return backupOp(h, errKind, errMsg, func(b backup.Backup) error {
		return b.Delete(callCtx(), C.GoString(key))
	})
}

// mp_backup_check checks that the store is reachable and usable, where the
// backend can tell (backup.Checker).
//
//export mp_backup_check
func mp_backup_check(h C.uintptr_t, errKind *C.int, errMsg **C.char) C.int {
	return backupOp(h, errKind, errMsg, func(b backup.Backup) error {
		if c, ok := b.(backup.Checker); ok {
			return c.Check(callCtx())
		}
		return nil
	})
}

func backupOp(h C.uintptr_t, errKind *C.int, errMsg **C.char, op func(backup.Backup) error) C.int {
	bh, err := lookup[*backupHandle](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	return setErr(withKind(kindBackup, op(bh.b)), errKind, errMsg)
}
