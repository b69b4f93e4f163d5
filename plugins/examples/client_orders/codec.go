package main

import (
	"strconv"

	"github.com/proteanhq/protean-host/pdk"
)

// Hand-written JSON codecs: with them the kit decodes and encodes these
// types without encoding/json's reflection (pdk.JSONDecoder and
// pdk.JSONAppender). They read and write what encoding/json would
// (unknown fields ignored, null leaves a field as it was but makes a slice
// nil); TestCodec checks that with pdktest.Codec.

// DecodeJSON implements pdk.JSONDecoder.
func (e *OrderPlaced) DecodeJSON(b []byte) error {
	return pdk.Fields(b, func(key, value []byte) (err error) {
		if pdk.IsNull(value) {
			return nil
		}
		switch string(key) {
		case "order_id":
			e.OrderID, err = pdk.String(value)
		case "client_id":
			e.ClientID, err = pdk.String(value)
		case "total":
			e.Total, err = pdk.Float(value)
		}
		return err
	})
}

// DecodeJSON implements pdk.JSONDecoder.
func (d *ClientOrders) DecodeJSON(b []byte) error {
	return pdk.Fields(b, func(key, value []byte) (err error) {
		if pdk.IsNull(value) {
			if string(key) == "order_ids" {
				d.OrderIDs = nil // as encoding/json: null makes a slice nil
			}
			return nil
		}
		switch string(key) {
		case "client_id":
			d.ClientID, err = pdk.String(value)
		case "orders":
			var n int64
			n, err = pdk.Int(value)
			d.Orders = int(n)
		case "total":
			d.Total, err = pdk.Float(value)
		case "order_ids":
			d.OrderIDs = d.OrderIDs[:0]
			if d.OrderIDs == nil {
				d.OrderIDs = []string{} // [] is an empty slice, not nil
			}
			err = pdk.Elements(value, func(v []byte) error {
				s, err := pdk.String(v)
				d.OrderIDs = append(d.OrderIDs, s)
				return err
			})
		}
		return err
	})
}

// AppendJSON implements pdk.JSONAppender.
func (d ClientOrders) AppendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"client_id":`...)
	b = pdk.AppendString(b, d.ClientID)
	b = append(b, `,"orders":`...)
	b = strconv.AppendInt(b, int64(d.Orders), 10)
	b = append(b, `,"total":`...)
	b, err := pdk.AppendFloat(b, d.Total)
	if err != nil {
		return nil, err
	}
	b = append(b, `,"order_ids":`...)
	if d.OrderIDs == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, id := range d.OrderIDs {
			if i > 0 {
				b = append(b, ',')
			}
			b = pdk.AppendString(b, id)
		}
		b = append(b, ']')
	}
	return append(b, '}'), nil
}
