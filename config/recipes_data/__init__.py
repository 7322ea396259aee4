"""Recipe data: `<name>.yaml` recipes and the chat templates they ship (read by config/recipes.py;
package data, see pyproject.toml). README.md says what a recipe holds and where each file's
values and texts come from."""
