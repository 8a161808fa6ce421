// Package etcd is the session store of several nodes sharing one bot: each
// shard's snapshot (sessions.Encode) lives at <prefix>sessions/<id>, beside
// the shard's ownership key.
//
// The guard rule: every Save, the mark-used included (a Save with an empty
// session id), is one transaction that commits only while shards/<id> has
// the generation this node holds for the shard (Config.Generation, from the
// ownership layer); otherwise it fails, naming the shard and both
// generations, and writes nothing. So an old owner, once the key was
// released or expired and re-created by another node, can neither write
// a snapshot back over the new owner's nor mark one used, and a snapshot
// the new owner marked used stays used. A Save for a shard the node holds
// no generation of fails with ErrNotOwned before any request. Loads are
// plain linearizable reads. No error shows a session id.
package etcd
