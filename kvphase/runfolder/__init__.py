"""A run folder's room, below sweep, probes and train, which all write one: its files
(`files.py`: the lock, atomic writes, JSON and CSV read with one-line damage errors) and
the page a person reads there (`page.py`: `ReportPage`, tables, figures)."""

from __future__ import annotations

from kvphase.runfolder.files import (CONFIG_FILE, LOCK_FILE, MANIFEST_FILE, REPORT_FILE, SUMMARY_FILE, WHOLE_LIMIT,
                                     RunLock, check_writable, complete_lines, drop_partial_last_line, file_sha256,
                                     flags_in, make_folder, numbers_in, read_json_object, read_table, refuse_rows,
                                     save_atomic, write_atomic, write_csv, write_json, writing)
from kvphase.runfolder.page import ReportPage, figure, figure_link, markdown_table

__all__ = ["CONFIG_FILE", "LOCK_FILE", "MANIFEST_FILE", "REPORT_FILE", "SUMMARY_FILE", "WHOLE_LIMIT", "ReportPage",
           "RunLock", "check_writable", "complete_lines", "drop_partial_last_line", "figure", "figure_link",
           "file_sha256", "flags_in", "make_folder", "markdown_table", "numbers_in", "read_json_object", "read_table",
           "refuse_rows", "save_atomic", "write_atomic", "write_csv", "write_json", "writing"]
