"""The run folder's page builder: every part in its place, empty parts left out."""

from __future__ import annotations

import pytest

from kvphase.errors import RunFolderError
from kvphase.runfolder import ReportPage


def test_a_page_sets_its_parts_apart_by_blank_lines_in_order():
    page = ReportPage(title="Probe: m.gguf", headline="phase 3 is weak", prose="What was done.",
                      figure=("plot.png", "a plot"), sections=[(None, "| a |"), ("Per phase", "text", "| b |")],
                      measured=["Model `m.gguf`.", "Wall time 1 s."], files="Files: `config.json`.")
    assert page.markdown() == ("# Probe: m.gguf\n\n**phase 3 is weak**\n\nWhat was done.\n\n![a plot](plot.png)\n\n"
                               "| a |\n\n## Per phase\n\ntext\n\n| b |\n\n## How this was measured\n\n"
                               "- Model `m.gguf`.\n- Wall time 1 s.\n\nFiles: `config.json`.\n")


def test_a_page_without_prose_figure_or_measurements_has_no_gaps_for_them():
    page = ReportPage(title="T", headline="H", sections=[("Over residues", "| a |")], files="Files: none.")
    assert page.markdown() == "# T\n\n**H**\n\n## Over residues\n\n| a |\n\nFiles: none.\n"


def test_a_folder_name_longer_than_the_file_system_allows_is_one_error(tmp_path):
    from kvphase.runfolder.files import make_folder

    with pytest.raises(RunFolderError, match="cannot create run folder .*File name too long"):
        make_folder(tmp_path / ("d" * 300))
