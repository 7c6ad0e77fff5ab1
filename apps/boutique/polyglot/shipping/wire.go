package main

// Reading shipping's requests as strictly as the Rust service's serde types do, so that a
// caller cannot tell the port from it: an input that is not UTF-8 or not JSON, a missing or
// mistyped field, a field given twice, a quantity out of u32's range are errors (the caller
// answers 400 `shipping: bad request: WHY`, WHY in serde's words without its line and
// column). encoding/json alone is laxer: it matches keys case-insensitively, takes null
// for a string, keeps the last of two equal keys, and lets invalid UTF-8 and lone surrogate
// escapes through as U+FFFD.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// object is a JSON object's members, and the keys it has more than once.
type object struct {
	members map[string]json.RawMessage
	twice   map[string]bool
}

// ParseRequest reads a shipping request: {"op":"quote"|"ship","address":{...},"items":[...]}.
func ParseRequest(input []byte) (Request, error) {
	var req Request
	if err := validJSON(input); err != nil {
		return req, err
	}
	root, err := readObject(bytes.TrimSpace(input), "internally tagged enum Request")
	if err != nil {
		return req, err
	}
	op, err := requiredString(root, "op")
	if err != nil {
		return req, err
	}
	if op != "quote" && op != "ship" {
		return req, fmt.Errorf("unknown variant `%s`, expected `quote` or `ship`", op)
	}
	req.Op = op
	raw, err := required(root, "address")
	if err != nil {
		return req, err
	}
	if req.Address, err = readAddress(raw); err != nil {
		return req, err
	}
	if raw, err = required(root, "items"); err != nil {
		return req, err
	}
	req.Items, err = readItems(raw)
	return req, err
}

func readAddress(raw json.RawMessage) (Address, error) {
	var a Address
	o, err := readObject(raw, "struct Address")
	if err != nil {
		return a, err
	}
	for _, f := range []struct {
		name string
		to   *string
	}{
		{"street_address", &a.StreetAddress},
		{"city", &a.City},
		{"state", &a.State},
		{"country", &a.Country},
		{"zip_code", &a.ZipCode},
	} {
		if *f.to, err = requiredString(o, f.name); err != nil {
			return a, err
		}
	}
	return a, nil
}

func readItems(raw json.RawMessage) ([]CartItem, error) {
	if raw[0] != '[' {
		return nil, fmt.Errorf("invalid type: %s, expected a sequence", describe(raw))
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, err
	}
	items := make([]CartItem, 0, len(list))
	for _, r := range list {
		o, err := readObject(r, "struct CartItem")
		if err != nil {
			return nil, err
		}
		var item CartItem
		if item.ProductID, err = requiredString(o, "product_id"); err != nil {
			return nil, err
		}
		q, err := required(o, "quantity")
		if err != nil {
			return nil, err
		}
		if item.Quantity, err = readU32(q); err != nil {
			return nil, err
		}
		items = append(items, item)
	}
	return items, nil
}

// validJSON checks the whole input once: UTF-8, JSON; what is read from it afterwards is
// well-formed.
func validJSON(input []byte) error {
	if !utf8.Valid(input) {
		return errors.New("invalid UTF-8")
	}
	if !json.Valid(input) {
		var v any
		if err := json.Unmarshal(input, &v); err != nil {
			return err // a syntax error saying where
		}
		return errors.New("not JSON")
	}
	return nil
}

// readObject reads the members of the object raw (well-formed JSON).
func readObject(raw json.RawMessage, what string) (object, error) {
	o := object{members: map[string]json.RawMessage{}, twice: map[string]bool{}}
	if raw[0] != '{' {
		return o, fmt.Errorf("invalid type: %s, expected %s", describe(raw), what)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // '{'
		return o, err
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return o, err
		}
		key, _ := t.(string) // an object's keys are strings
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return o, err
		}
		if _, seen := o.members[key]; seen {
			o.twice[key] = true
		}
		o.members[key] = v
	}
	return o, nil
}

func required(o object, name string) (json.RawMessage, error) {
	if o.twice[name] {
		return nil, fmt.Errorf("duplicate field `%s`", name)
	}
	raw, ok := o.members[name]
	if !ok {
		return nil, fmt.Errorf("missing field `%s`", name)
	}
	return raw, nil
}

func requiredString(o object, name string) (string, error) {
	raw, err := required(o, name)
	if err != nil {
		return "", err
	}
	if raw[0] != '"' {
		return "", fmt.Errorf("invalid type: %s, expected a string", describe(raw))
	}
	if err := surrogatesPaired(raw); err != nil {
		return "", err
	}
	var s string
	err = json.Unmarshal(raw, &s)
	return s, err
}

// readU32 reads a JSON integer from 0 to 2^32-1; a number with a fraction or an exponent is
// a float to serde, never an integer.
func readU32(raw json.RawMessage) (uint32, error) {
	if !isInteger(raw) {
		return 0, fmt.Errorf("invalid type: %s, expected u32", describe(raw))
	}
	n, err := strconv.ParseUint(string(raw), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("invalid value: integer `%s`, expected u32", raw)
	}
	return uint32(n), nil
}

// isInteger tells a JSON number without a fraction or an exponent from any other value
// (well-formed JSON).
func isInteger(raw json.RawMessage) bool {
	isNumber := raw[0] == '-' || ('0' <= raw[0] && raw[0] <= '9')
	return isNumber && !bytes.ContainsAny(raw, ".eE")
}

// describe names an unexpected value as serde does.
func describe(raw json.RawMessage) string {
	switch {
	case raw[0] == 'n':
		return "null"
	case raw[0] == 't' || raw[0] == 'f':
		return fmt.Sprintf("boolean `%s`", raw)
	case raw[0] == '"':
		return "string " + string(raw)
	case raw[0] == '[':
		return "sequence"
	case raw[0] == '{':
		return "map"
	case isInteger(raw):
		return fmt.Sprintf("integer `%s`", raw)
	default:
		return fmt.Sprintf("floating point `%s`", raw)
	}
}

// surrogatesPaired refuses a \uD800-\uDFFF escape that is not half of a pair (a well-formed
// JSON string, quotes included), as serde_json does.
func surrogatesPaired(raw json.RawMessage) error {
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		if raw[i+1] != 'u' {
			i++ // a two-character escape, \\ included
			continue
		}
		cp, _ := strconv.ParseUint(string(raw[i+2:i+6]), 16, 32)
		switch {
		case 0xDC00 <= cp && cp <= 0xDFFF:
			return errors.New("lone trailing surrogate in hex escape")
		case 0xD800 <= cp && cp <= 0xDBFF:
			next := raw[i+6:]
			if len(next) < 6 || next[0] != '\\' || next[1] != 'u' {
				return errors.New("lone leading surrogate in hex escape")
			}
			lo, _ := strconv.ParseUint(string(next[2:6]), 16, 32)
			if lo < 0xDC00 || lo > 0xDFFF {
				return errors.New("lone leading surrogate in hex escape")
			}
			i += 11
		default:
			i += 5
		}
	}
	return nil
}
