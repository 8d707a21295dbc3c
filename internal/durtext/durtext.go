// Package durtext prints durations rounded for people, the one way pgbox's
// binary, status text and examples print them: 3d4h, 2h5m, 41s, 120ms.
package durtext

import (
	"fmt"
	"strings"
	"time"
)

// Short prints d rounded for people: whole days and hours from 48h up, then
// hours and minutes, seconds, milliseconds; "-" for zero.
func Short(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	neg := ""
	if d < 0 {
		neg, d = "-", -d
	}
	switch {
	case d >= 48*time.Hour:
		days, h := d/(24*time.Hour), (d%(24*time.Hour))/time.Hour
		if h == 0 {
			return fmt.Sprintf("%s%dd", neg, days)
		}
		return fmt.Sprintf("%s%dd%dh", neg, days, h)
	case d >= time.Hour:
		return neg + trimZeros(d.Round(time.Minute).String())
	case d >= time.Second:
		return neg + trimZeros(d.Round(time.Second).String())
	}
	return neg + d.Round(time.Millisecond).String()
}

// trimZeros drops zero trailing units: 10m0s → 10m, 2h0m → 2h.
func trimZeros(s string) string {
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
