"""Task families: generators that write valid Harbor task directories through the one writer
(`sources.authoring.writer`), one package per family: `demo` (bug fixes in generated packages),
`data_analysis` (artifact verifier), `ops` (rule verifier)."""
