// A go-redis stream worker against mwmq, unchanged: a consumer group of two
// workers shares a stream's messages (XReadGroup with BLOCK, XAck); a third
// worker reads a batch and "dies" without acknowledging it; a fourth claims
// what it left with XAutoClaim. Prints a JSON summary; exits 1 on a wrong
// result.
//
// Usage: goredis-streams ADDR [USER PASSWORD]
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	stream = "app.go"
	group  = "workers"
	total  = 60
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) < 2 {
		fail("usage: goredis-streams ADDR [USER PASSWORD]")
	}
	opts := &redis.Options{Addr: os.Args[1], Protocol: 2}
	if len(os.Args) == 4 {
		opts.Username, opts.Password = os.Args[2], os.Args[3]
	}
	rdb := redis.NewClient(opts)
	ctx := context.Background()
	if err := rdb.XGroupCreateMkStream(ctx, stream, group, "$").Err(); err != nil {
		fail("XGroupCreateMkStream: %v", err)
	}

	// A worker that reads a batch and dies before acknowledging it.
	for i := 0; i < 5; i++ {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"n": i}}).Err(); err != nil {
			fail("XAdd: %v", err)
		}
	}
	lost, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: group, Consumer: "dies", Streams: []string{stream, ">"}, Count: 5, Block: -1,
	}).Result()
	if err != nil || len(lost) != 1 || len(lost[0].Messages) != 5 {
		fail("the dying worker's read: %v %v", lost, err)
	}

	var mu sync.Mutex
	handled := map[int]string{}
	take := func(who string, msgs []redis.XMessage) {
		for _, m := range msgs {
			n, err := strconv.Atoi(fmt.Sprint(m.Values["n"]))
			if err != nil {
				fail("a message without n: %v", m)
			}
			mu.Lock()
			if prev, twice := handled[n]; twice {
				mu.Unlock()
				fail("message %d handled by %s and %s", n, prev, who)
			}
			handled[n] = who
			mu.Unlock()
			if err := rdb.XAck(ctx, stream, group, m.ID).Err(); err != nil {
				fail("XAck: %v", err)
			}
		}
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	for _, who := range []string{"w1", "w2"} {
		wg.Add(1)
		go func(who string) {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
					Group: group, Consumer: who, Streams: []string{stream, ">"}, Count: 4, Block: 200 * time.Millisecond,
				}).Result()
				if err == redis.Nil {
					continue
				}
				if err != nil {
					fail("XReadGroup: %v", err)
				}
				for _, s := range res {
					take(who, s.Messages)
				}
			}
		}(who)
	}
	for i := 5; i < total; i++ {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"n": i}}).Err(); err != nil {
			fail("XAdd: %v", err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := len(handled)
		mu.Unlock()
		if n >= total-5 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(done)
	wg.Wait()

	// What the dead worker left is claimed once idle.
	time.Sleep(150 * time.Millisecond)
	claimed, _, err := rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream: stream, Group: group, Consumer: "rescuer", MinIdle: 100 * time.Millisecond, Start: "0-0", Count: 100,
	}).Result()
	if err != nil {
		fail("XAutoClaim: %v", err)
	}
	take("rescuer", claimed)

	pending, err := rdb.XPending(ctx, stream, group).Result()
	if err != nil {
		fail("XPending: %v", err)
	}
	groups, err := rdb.XInfoGroups(ctx, stream).Result()
	if err != nil || len(groups) != 1 {
		fail("XInfoGroups: %v %v", groups, err)
	}
	consumers, err := rdb.XInfoConsumers(ctx, stream, group).Result()
	if err != nil {
		fail("XInfoConsumers: %v", err)
	}
	names := []string{}
	for _, c := range consumers {
		names = append(names, c.Name)
	}
	sort.Strings(names)
	by := map[string]int{}
	for _, who := range handled {
		by[who]++
	}
	out, _ := json.Marshal(map[string]any{
		"handled": len(handled), "by": by, "pending": pending.Count, "lag": groups[0].Lag,
		"entries_read": groups[0].EntriesRead, "consumers": names, "rescued": len(claimed),
	})
	fmt.Println(string(out))
	if len(handled) != total || pending.Count != 0 || len(claimed) != 5 {
		os.Exit(1)
	}
}
