// Package httpjson holds what the HTTP API and Envoy's POST /json share
// about JSON bodies: refusing one that is not UTF-8 text, and answering a
// failure as a problem details object (RFC 9457).
package httpjson

import (
	"encoding/json"
	"fmt"
	"net/http"
	"unicode/utf8"
)

// CheckUTF8 refuses a JSON body that is not UTF-8 text: one with bytes
// that are not UTF-8, or that escapes half a UTF-16 surrogate pair
// ("\ud800"). encoding/json reads either as U+FFFD, so that keys which
// differ ("x\xffy", "x\xfey", "x\ufffdy") would share one bucket.
func CheckUTF8(body []byte) error {
	if !utf8.Valid(body) {
		at := 0
		for at < len(body) {
			r, n := utf8.DecodeRune(body[at:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			at += n
		}
		return fmt.Errorf("the body is not valid UTF-8 (byte %d): JSON text must be UTF-8, so keys are UTF-8 text; binary keys can be sent over the Redis protocol", at)
	}
	// A backslash is only valid in a string, where it starts an escape:
	// skipping each escape whole keeps "\\u" from being read as "\u".
	for i := 0; i+1 < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		if body[i+1] != 'u' {
			i++
			continue
		}
		hi, ok := hex4(body[i+2:])
		switch {
		case !ok || hi < 0xd800 || hi > 0xdfff:
		case hi <= 0xdbff && len(body) >= i+12 && body[i+6] == '\\' && body[i+7] == 'u':
			if lo, ok := hex4(body[i+8:]); ok && lo >= 0xdc00 && lo <= 0xdfff {
				i += 6 // a pair: one character
				break
			}
			fallthrough
		default:
			return fmt.Errorf("the body is not valid UTF-8 text: %s at byte %d is half a UTF-16 surrogate pair, not a character", body[i:i+6], i)
		}
		i += 5
	}
	return nil
}

// hex4 reads the four hex digits at the start of b.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// Problem answers status with a problem details object whose detail is
// detail, in application/problem+json.
func Problem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": http.StatusText(status), "status": status, "detail": detail})
}
