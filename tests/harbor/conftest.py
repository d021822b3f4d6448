# The fixture task directories hold tests of their own: they run inside the verifier, not here.
collect_ignore_glob = ["fixtures/*"]
