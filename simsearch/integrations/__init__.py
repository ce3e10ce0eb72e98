"""simsearch's engine inside other trainers: what their search tools send to `simsearch serve`.

`search_client` builds `/retrieve` bodies and renders their answers (no framework needed);
`verl_data` writes QA data as verl's Parquet rows; `verl` is verl's tool class, importable only
where verl is installed. docs/integrations.md gives each framework's steps.
"""
