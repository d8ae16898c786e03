package progress

import "time"

func durationMicros(n int) time.Duration { return time.Duration(n) * time.Microsecond }
