from postcast.main import run

run()
