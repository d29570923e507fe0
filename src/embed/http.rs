//! What the network providers share: one blocking request with a timeout, retries with
//! backoff, and `Retry-After` on 429.
