from celery import Celery
app = Celery("onredis", broker="redis://127.0.0.1:6393/0")
@app.task
def add(x, y): return x + y
