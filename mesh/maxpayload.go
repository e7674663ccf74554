package mesh

// MaxPayload returns the largest message the client's connection may
// publish (the server's max_payload, headers included), or 0 if it is not
// known yet.
func (c *Client) MaxPayload() int64 { return c.cfg.Conn.MaxPayload() }
