"""One attempt on the wire: senders, the SSRF guard, signatures, the retry policy.
Knows nothing of Redis."""
