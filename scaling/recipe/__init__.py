"""The batch-size recipe in one place: what is asked (request), the largest mbs per GPU count (mbs_search), the points
measured (measure), each row's figure (estimate, predicted), the decision (options, decide, answer), the next
measurement (next_point), and the answer written (render). `scaling recipe` (scaling.cli.recipe) is its entry."""
