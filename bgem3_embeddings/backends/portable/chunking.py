"""Where attention starts running in query chunks: above this padded length, chunks of this size
(bounded memory, the same result). Read at call time by every runner, so a test may lower it."""

LONG_INPUT_CHUNK = 1024
