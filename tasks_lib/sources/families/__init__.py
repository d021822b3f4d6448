"""Task families: generators that write valid Harbor task directories, one module per family."""
