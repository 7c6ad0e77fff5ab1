// Command shipping is the boutique's shipping service in Go, as in Google's original: quotes
// (a flat 8.99 USD for any non-empty order, the current original's rule) and shipments (a
// tracking id). A port of src/services/shipping.rs: the same requests
// ({"op":"quote"|"ship", address, items}), the same answers and the same errors.
//
// Built with cgo over the C SDK (see README.md, "The original's languages"), run by
// chain-polyglot.yaml by `command`.
package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"

	"zerohop.dev/zerohop"
)

// Money is an amount, as money.rs's Money.
type Money struct {
	CurrencyCode string `json:"currency_code"`
	Units        int64  `json:"units"`
	Nanos        int32  `json:"nanos"`
}

// Address is where an order goes; every field is required.
type Address struct {
	StreetAddress string
	City          string
	State         string
	Country       string
	ZipCode       string
}

// CartItem is a product and how many of it.
type CartItem struct {
	ProductID string
	Quantity  uint32
}

// Request is what shipping is asked: Op is "quote" or "ship".
type Request struct {
	Op      string
	Address Address
	Items   []CartItem
}

type quoteAnswer struct {
	CostUSD Money `json:"cost_usd"`
}

type shipment struct {
	TrackingID string `json:"tracking_id"`
}

// Quote is the cost of shipping count items.
func Quote(count uint64) Money {
	if count == 0 {
		return Money{CurrencyCode: "USD"}
	}
	return Money{CurrencyCode: "USD", Units: 8, Nanos: 990_000_000}
}

// TrackingID is a random id shaped as the Rust service's: two capital letters and two
// groups of six digits, `QK-483920-118273`.
func TrackingID() string {
	letter := func() rune { return 'A' + rune(rand.IntN(26)) }
	return fmt.Sprintf("%c%c-%06d-%06d", letter(), letter(), rand.IntN(1_000_000), rand.IntN(1_000_000))
}

func badRequest(message string) error {
	return &zerohop.Error{Status: 400, Message: message}
}

// Serve answers one call's input.
func Serve(input []byte) ([]byte, error) {
	req, err := ParseRequest(input)
	if err != nil {
		return nil, badRequest("shipping: bad request: " + err.Error())
	}
	switch req.Op {
	case "quote":
		var count uint64
		for _, i := range req.Items {
			count += uint64(i.Quantity)
		}
		return json.Marshal(quoteAnswer{CostUSD: Quote(count)})
	default: // "ship", the only other op ParseRequest lets through
		if len(req.Items) == 0 {
			return nil, badRequest("nothing to ship")
		}
		if req.Address.StreetAddress == "" || req.Address.Country == "" {
			return nil, badRequest("address needs a street and a country")
		}
		return json.Marshal(shipment{TrackingID: TrackingID()})
	}
}

func main() {
	zerohop.Run(func(r *zerohop.Request) (zerohop.Next, error) {
		// The input is parsed before the body is replaced: nothing refers to the old
		// body's slice once SetBody copies the output in.
		out, err := Serve(r.Body())
		if err != nil {
			return zerohop.Continue, err
		}
		return zerohop.Continue, r.SetBody(out)
	})
}
