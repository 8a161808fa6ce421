package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/shardfs/shardfs/core"
)

// guildPage is the page size CountGuilds asks for: the most the API
// returns at once.
const guildPage = 200

// CountGuilds counts the bot's guilds (Fluxer: communities) by paging
// GET {api}/users/@me/guilds in ascending id order until a page comes back
// short. It is how a Fluxer node sizes a new plan (DESIGN.md section
// 7.5), since Fluxer's discovery always recommends one shard. A page that
// fails, is malformed, or does not move past the previous page's last id
// (a broken cursor would make the count loop for ever) fails the whole
// count at once: a count that is not whole must not size a plan.
func CountGuilds(ctx context.Context, client *http.Client, flavor core.Flavor, api, token string) (int, error) {
	count, page := 0, 0
	var after uint64
	for {
		page++
		path := "/users/@me/guilds?limit=" + strconv.Itoa(guildPage)
		if after != 0 {
			path += "&after=" + strconv.FormatUint(after, 10)
		}
		ids, err := guildIDs(ctx, client, flavor, api, path, token)
		if err != nil {
			return 0, fmt.Errorf("gateway: counting guilds: page %d (after %d guilds): %w", page, count, err)
		}
		for _, id := range ids {
			if id <= after {
				return 0, fmt.Errorf("gateway: counting guilds: page %d (after %d guilds) does not move past guild %d: it holds guild %d", page, count, after, id)
			}
			after = id
		}
		count += len(ids)
		if len(ids) < guildPage {
			return count, nil
		}
	}
}

// guildIDs fetches one page of the guild list and returns its ids.
func guildIDs(ctx context.Context, client *http.Client, flavor core.Flavor, api, path, token string) ([]uint64, error) {
	body, closeBody, err := apiGet(ctx, client, flavor, api, path, token)
	if err != nil {
		return nil, err
	}
	defer closeBody()
	var page []struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(body).Decode(&page); err != nil {
		return nil, fmt.Errorf("malformed answer: %w", err)
	}
	if len(page) > guildPage {
		return nil, fmt.Errorf("malformed answer: %d guilds in a page of at most %d", len(page), guildPage)
	}
	ids := make([]uint64, len(page))
	for i, g := range page {
		id, err := strconv.ParseUint(g.ID, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("malformed answer: guild id %.40q is not a snowflake", g.ID)
		}
		ids[i] = id
	}
	return ids, nil
}
