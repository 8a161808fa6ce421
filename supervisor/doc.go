// Package supervisor runs children that each serve a block of a plan's
// shards, restarts them under a bounded policy, and serves one tree for
// all of them (DESIGN.md section 7.4).
package supervisor
