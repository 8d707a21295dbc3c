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
		s := d.Round(time.Minute).String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		return neg + s
	case d >= time.Second:
		return neg + d.Round(time.Second).String()
	}
	return neg + d.Round(time.Millisecond).String()
}
