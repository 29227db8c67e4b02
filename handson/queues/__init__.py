"""The queue contract every queue meets, its checks, and the Streams log."""
