package backup

import (
	"fmt"
	"strings"
)

// ValidateKey reports whether key is a well-formed object key: non-empty,
// "/"-separated, with no leading or trailing "/", no empty segment, no "."
// or ".." segment, and no NUL or backslash. The same keys are valid for every
// backend, so a store can move between backends.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("invalid key %q: empty", key)
	}
	if strings.HasPrefix(key, "/") {
		return fmt.Errorf("invalid key %q: leading /", key)
	}
	if err := checkChars(key); err != nil {
		return fmt.Errorf("invalid key %q: %w", key, err)
	}
	for _, seg := range strings.Split(key, "/") {
		if err := checkSegment(seg); err != nil {
			return fmt.Errorf("invalid key %q: %w", key, err)
		}
	}
	return nil
}

// ValidatePrefix reports whether prefix is a well-formed listing prefix: the
// empty string, or a string that could begin a valid key. Unlike a key, a
// prefix may end with "/" and its last segment may be partial.
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if strings.HasPrefix(prefix, "/") {
		return fmt.Errorf("invalid prefix %q: leading /", prefix)
	}
	if err := checkChars(prefix); err != nil {
		return fmt.Errorf("invalid prefix %q: %w", prefix, err)
	}
	segs := strings.Split(prefix, "/")
	// Every segment but the last is complete and must be valid; the last one
	// may be empty (trailing "/") or a partial name.
	for _, seg := range segs[:len(segs)-1] {
		if err := checkSegment(seg); err != nil {
			return fmt.Errorf("invalid prefix %q: %w", prefix, err)
		}
	}
	if last := segs[len(segs)-1]; last == ".." {
		return fmt.Errorf("invalid prefix %q: %q segment", prefix, last)
	}
	return nil
}

func checkChars(s string) error {
	if strings.ContainsRune(s, 0) {
		return fmt.Errorf("contains NUL")
	}
	if strings.ContainsRune(s, '\\') {
		return fmt.Errorf("contains backslash")
	}
	return nil
}

func checkSegment(seg string) error {
	switch seg {
	case "":
		return fmt.Errorf("empty segment")
	case ".", "..":
		return fmt.Errorf("%q segment", seg)
	}
	return nil
}
