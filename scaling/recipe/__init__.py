"""The batch-size recipe's steps that run points: the largest mbs that fits (find_mbs) and the recipe end to end
(measure: what a sweep directory lacks, measured, then decided by scaling.recipe.decide)."""
