package soak

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// socketOwner finds which of pids holds the loopback TCP socket whose local
// port is port and whose peer port is peer, through /proc (Linux): the
// socket's inode from /proc/net/tcp, then the process whose fd links to
// socket:[inode]. It tells the simulator's connections apart by node,
// since every node dials the same gateway address.
func socketOwner(port, peer int, pids []int) (int, error) {
	inode, err := socketInode(port, peer)
	if err != nil {
		return 0, err
	}
	link := "socket:[" + inode + "]"
	for _, pid := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue // ended meanwhile
		}
		for _, e := range ents {
			if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == link {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("socket 127.0.0.1:%d (inode %s) belongs to none of %v", port, inode, pids)
}

// socketInode reads /proc/net/tcp for the socket local:port -> peer.
func socketInode(port, peer int) (string, error) {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return "", err
	}
	defer f.Close()
	local := fmt.Sprintf(":%04X", port)
	remote := fmt.Sprintf(":%04X", peer)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		fl := strings.Fields(sc.Text())
		if len(fl) < 10 || !strings.HasSuffix(fl[1], local) || !strings.HasSuffix(fl[2], remote) {
			continue
		}
		if fl[9] != "0" {
			return fl[9], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("no socket 127.0.0.1:%d -> :%d in /proc/net/tcp", port, peer)
}

// portOf is the port of host:port.
func portOf(addr string) int {
	i := strings.LastIndexByte(addr, ':')
	p, _ := strconv.Atoi(addr[i+1:])
	return p
}
