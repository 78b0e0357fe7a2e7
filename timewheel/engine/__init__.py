"""The engine: claim what is due, wait for its millisecond, fire it (ticker, timeline,
dispatcher and the batching of their Redis calls). Imports store/ and delivery/, never api/."""
