package pdk

import (
	"encoding/json"

	"github.com/proteanhq/protean-host/abi"
)

// rawHost is the host's functions as ABI v1 has them: JSON in, JSON out.
type rawHost interface {
	load(req []byte) []byte
	readStream(req []byte) []byte
	log(level, msg string)
}

// jsonHost speaks ABI v1 to a rawHost.
type jsonHost struct{ raw rawHost }

func (h jsonHost) load(req *abi.LoadRequest) (*abi.LoadResponse, error) {
	b, _ := json.Marshal(req)
	var resp abi.LoadResponse
	if err := json.Unmarshal(h.raw.load(b), &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

func (h jsonHost) readStream(req *abi.ReadStreamRequest) (*abi.ReadStreamResponse, error) {
	b, _ := json.Marshal(req)
	var resp abi.ReadStreamResponse
	if err := json.Unmarshal(h.raw.readStream(b), &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

func (h jsonHost) log(level, msg string) { h.raw.log(level, msg) }
