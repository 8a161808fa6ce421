package enroll

import (
	"encoding/json"
	"testing"
)

// FuzzRequest: whatever a client sends as its request line, the server's
// decoding and CSR check return an error or a request, never panic, and
// never accept a CSR for a key other than the handshake's.
func FuzzRequest(f *testing.F) {
	key, err := NewKey()
	if err != nil {
		f.Fatal(err)
	}
	good, err := csr(key, "node")
	if err != nil {
		f.Fatal(err)
	}
	line, _ := json.Marshal(Request{Name: "n", MAC: "52:54:00:12:34:56", CSR: good})
	f.Add(line)
	f.Add([]byte(`{"csr":"AAEC"}`))
	f.Add([]byte(`{"code":"x","csr":null}`))
	other, err := NewKey()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		var req Request
		if json.Unmarshal(line, &req) != nil {
			return
		}
		if _, err := checkCSR(req.CSR, &other.PublicKey); err == nil {
			t.Errorf("checkCSR(%x) accepted a CSR for another key", req.CSR)
		}
		checkCSR(req.CSR, &key.PublicKey)
	})
}
