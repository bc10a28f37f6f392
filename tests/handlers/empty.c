/* empty.c - a shared library with neither uprobe_init nor uprobe_exit. */
int empty_library_function(void)
{
	return 0;
}
