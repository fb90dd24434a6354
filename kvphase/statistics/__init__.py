"""The statistical methods of a run, each respecting its contexts: the stratified test
(`stratified`), power and sample size (`power`), intervals and clustering (`intervals`), a
large modulus read against a stride that divides it (`nested`) and the tests whose unit is a
whole context (`context_units`). Below sweep/, which reads runs with them; imports nothing of
kvphase but its defaults."""
