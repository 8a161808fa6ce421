package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// tokenFDVar tells a re-executed serve which descriptor holds its token.
// It carries a number, never the secret.
const tokenFDVar = "SHARDFS_TOKEN_FD"

// maxToken bounds a token; the handover pipe must hold it whole before
// the exec (Linux pipes hold 64 KiB, and PIPE_BUF is 4 KiB).
const maxToken = 4096

// readToken returns the token from --token-file or SHARDFS_TOKEN.
//
// Unsetenv cannot clear /proc/PID/environ, which is the environment the
// process was started with, and anyone who can ptrace the process (its
// own user) reads it. So when SHARDFS_TOKEN is set, readToken does not
// return: it re-executes the binary in place (same PID, so signals and the
// exit status are the caller's as before) with the variable removed and
// the token in a pipe, whose read end the new image finds through
// SHARDFS_TOKEN_FD.
func readToken(file string) (string, error) {
	if fd, ok := os.LookupEnv(tokenFDVar); ok {
		os.Unsetenv(tokenFDVar)
		if err := notDumpable(); err != nil {
			return "", err
		}
		return readHandedToken(fd)
	}
	if err := notDumpable(); err != nil {
		return "", err
	}
	tok, inEnv := os.LookupEnv("SHARDFS_TOKEN")
	if file != "" {
		b, err := readTokenFile(file)
		if err != nil {
			return "", err
		}
		tok = string(b)
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", fmt.Errorf("no token: set SHARDFS_TOKEN or pass --token-file FILE")
	}
	if len(tok) > maxToken {
		return "", fmt.Errorf("the token is longer than %d bytes", maxToken)
	}
	if inEnv {
		return "", reexecWithToken(tok)
	}
	return tok, nil
}

// reexecWithToken replaces the process image with itself, SHARDFS_TOKEN
// removed from the environment and tok waiting in a pipe. It returns only
// on failure.
func reexecWithToken(tok string) error {
	var p [2]int
	// No O_CLOEXEC: the read end must survive the exec. Nothing else in
	// the binary forks at this point, so the write end cannot leak into a
	// child before it is closed.
	if err := unix.Pipe2(p[:], 0); err != nil {
		return fmt.Errorf("handing the token over a pipe: %w", err)
	}
	_, err := unix.Write(p[1], []byte(tok))
	unix.Close(p[1])
	if err != nil {
		unix.Close(p[0])
		return fmt.Errorf("handing the token over a pipe: %w", err)
	}
	env := []string{tokenFDVar + "=" + strconv.Itoa(p[0])}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SHARDFS_TOKEN=") && !strings.HasPrefix(kv, tokenFDVar+"=") {
			env = append(env, kv)
		}
	}
	err = syscall.Exec("/proc/self/exe", os.Args, env)
	unix.Close(p[0])
	return fmt.Errorf("re-executing without SHARDFS_TOKEN in the environment: %w (pass --token-file FILE instead)", err)
}

// readHandedToken reads the token that reexecWithToken left in the pipe.
func readHandedToken(fdText string) (string, error) {
	fd, err := strconv.Atoi(fdText)
	if err != nil || fd < 3 {
		return "", fmt.Errorf("%s=%q: not a descriptor", tokenFDVar, fdText)
	}
	f := os.NewFile(uintptr(fd), "token pipe")
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxToken+1))
	if err != nil {
		return "", fmt.Errorf("reading the token from descriptor %d: %w", fd, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" || len(tok) > maxToken {
		return "", fmt.Errorf("descriptor %d held no token", fd)
	}
	return tok, nil
}

// notDumpable keeps the token out of core dumps and out of reach of
// ptrace and /proc/PID/mem for processes of the same user (root keeps
// CAP_SYS_PTRACE). Set before the token is read, it covers serve,
// supervise and supervise's children, which all read it here.
func notDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("making the process that holds the token not dumpable: %w", err)
	}
	return nil
}

// readTokenFile reads --token-file (see readSecretFile).
func readTokenFile(file string) ([]byte, error) {
	return readSecretFile("--token-file", file, os.Getuid())
}

// readSecretFile reads a file holding a secret (--token-file,
// --etcd-password-file), refusing one that other users may read or
// write, or that belongs to another user than me or root (its owner can
// change its mode, and it replaces the secret: a token of its own bot,
// an etcd password of its choosing). The owner and the mode are checked
// on the descriptor that is read, so that a chmod or a rename between
// the check and the read changes nothing.
func readSecretFile(flag, file string, me int) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s %s: not a regular file", flag, file)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int64(st.Uid) != int64(me) && st.Uid != 0 {
		return nil, fmt.Errorf("%s %s: owned by uid %d, not by uid %d (this process) or root; chown it", flag, file, st.Uid, me)
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		return nil, fmt.Errorf("%s %s: mode %04o lets other users read or change it; chmod 600 it", flag, file, m)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxToken+1))
	if err == nil && len(bytes.TrimSpace(b)) > maxToken {
		return nil, fmt.Errorf("%s %s: longer than %d bytes", flag, file, maxToken)
	}
	return b, err
}
